"""snapkv_global (the prefix-pruning scorer) against its oracle (oracles/snapkv_global.py) on randomized fp32
inputs: the pooled per-position scores match, and the keep mask of random ranges (the top keep_tokens, what the
engine's PrunedRange reports before page rounding) equals the oracle's."""
import numpy as np
import pytest

import fidelity_harness as fh
from oracles.snapkv_global import keep_mask, snapkv_global_scores


@pytest.mark.parametrize("seed", range(24))
def test_snapkv_global_matches_oracle(seed, tmp_path):
    rng = np.random.default_rng(9100 + seed)
    group = 4 if seed % 2 == 0 else 1
    num_kv_heads = int(rng.integers(1, 4))
    window = int(rng.choice([1, 8, 32]))
    case = fh.Case(num_layers=int(rng.integers(1, 4)), num_heads=num_kv_heads * group, num_kv_heads=num_kv_heads,
                   head_dim=int(rng.choice([16, 32])), page_size=int(rng.choice([4, 16])),
                   prefill_len=int(rng.integers(window + 10, 300)), seed=seed).generate()
    result = fh.run("snapkv_global", {"window": window}, case, tmp_path)
    state = result.states[0]
    assert state["window"] == window
    got = np.asarray(state["scores"], dtype=np.float64)
    keys = [case.all_keys(layer) for layer in range(case.num_layers)]
    queries = [case.prefill_queries(layer)[-window:] for layer in range(case.num_layers)]
    want = snapkv_global_scores(queries, keys, 1 / np.sqrt(case.head_dim))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    # Keep masks from the scorer's own scores (ties decided on identical numbers) equal the oracle's from its.
    for _ in range(4):
        start = int(rng.integers(0, case.prefill_len - 1))
        end = int(rng.integers(start + 1, case.prefill_len + 1))
        keep = int(rng.integers(0, end - start + 1))
        want_mask = keep_mask(want, case.prefill_len, window, start, end, keep)
        got_mask = keep_mask(got, case.prefill_len, window, start, end, keep)
        assert got_mask == want_mask, (start, end, keep)
