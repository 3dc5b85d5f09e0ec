"""vanilla keeps every token of every stream and attends densely: kept sets are the full prefix, outputs equal
dense causal attention, and it reports exactly the pages it holds."""
import numpy as np
import pytest

import fidelity_harness as fh
from oracles.common import attention_over


@pytest.mark.parametrize("seed", range(5))
def test_vanilla_keeps_everything_and_attends_densely(seed, tmp_path):
    case = fh.Case(prefill_len=70, prefill_chunks=[33, 37], decode_steps=4, seed=seed).generate()
    result = fh.run("vanilla", {}, case, tmp_path)
    scale = 1 / np.sqrt(case.head_dim)
    total = 0
    for step, n in enumerate(case.steps()):
        total += n
        for layer in range(case.num_layers):
            assert result.kept[step][layer] == [list(range(total))] * case.num_kv_heads
        if n == 1:  # decode: one query row against every stored token
            for layer in range(case.num_layers):
                keys, values = case.all_keys(layer)[:total], case.all_values(layer)[:total]
                want = attention_over(case.q[step][layer][0], keys, values, [range(total)] * case.num_kv_heads, scale)
                np.testing.assert_allclose(result.outputs[step][layer][0], want, rtol=1e-4, atol=1e-5)
    assert result.resident_pages == result.reported_pages
