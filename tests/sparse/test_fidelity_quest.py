"""quest: at every decode step, each layer >= dense_layers reads exactly the pages the oracle (oracles/quest.py)
selects per KV head (the last page plus the top pages by key-bound score), layers below it and prefill read
everything, attention equals dense attention over the selected pages' tokens, and nothing is evicted."""
import subprocess

import numpy as np
import pytest

import fidelity_harness as fh
from oracles import quest
from oracles.common import attention_over

NUM_TRIALS = 100


def trial(seed):
    """Randomized shapes and hyperparameters of one trial; every tenth trial has a budget above the context."""
    rng = np.random.default_rng(7000 + seed)
    group = (1, 4)[seed % 2]
    num_kv_heads = 4 if group == 1 else 2
    page_size = (16, 8)[(seed // 2) % 2]
    prefill_len = int(rng.integers(100, 600))
    chunks = []
    if rng.random() < 0.5:
        cut = sorted(rng.choice(np.arange(1, prefill_len), size=int(rng.integers(1, 3)), replace=False))
        chunks = [int(b - a) for a, b in zip([0] + cut, cut + [prefill_len])]
    token_budget = 4096 if seed % 10 == 9 else int(rng.choice([page_size, 32, 64, 100, 128, 256]))
    case = fh.Case(num_layers=3, num_heads=num_kv_heads * group, num_kv_heads=num_kv_heads,
                   head_dim=int(rng.choice([32, 64])), page_size=page_size, prefill_len=prefill_len,
                   prefill_chunks=chunks, decode_steps=int(rng.integers(3, 7)), seed=seed)
    config = {"token_budget": token_budget, "dense_layers": int(rng.integers(0, 3)),
              "gqa_agg": str(rng.choice(["mean", "max", "sum"]))}
    return case.generate(), config


@pytest.mark.parametrize("seed", range(NUM_TRIALS))
def test_quest_selects_the_oracle_pages(seed, tmp_path):
    case, config = trial(seed)
    result = fh.run("quest", config, case, tmp_path)
    assert result.selection_unit == "page"
    scale = 1 / np.sqrt(case.head_dim)
    total, num_sparse = 0, 0
    for step, n in enumerate(case.steps()):
        total += n
        for layer in range(case.num_layers):
            assert result.kept[step][layer] == [list(range(total))] * case.num_kv_heads  # full history
            keys, values = case.all_keys(layer)[:total], case.all_values(layer)[:total]
            if n > 1 or layer < config["dense_layers"]:
                assert result.selected[step][layer] is None, (step, layer)
                want = None
            else:
                want = quest.select_pages(case.q[step][layer][0], keys, case.page_size, config["token_budget"],
                                          config["gqa_agg"])
                # A decode step ranks every sequence; streams that fit the budget list all their pages (dense).
                every_page = [list(range(-(-total // case.page_size)))] * case.num_kv_heads
                assert result.selected[step][layer] == (every_page if want is None else want), (step, layer)
                num_sparse += want is not None
            if n == 1:  # the decode output is dense attention restricted to the selected pages' tokens
                tokens = [range(total)] * case.num_kv_heads if want is None else \
                    [quest.pages_to_tokens(p, case.page_size, total) for p in want]
                expect = attention_over(case.q[step][layer][0], keys, values, tokens, scale)
                np.testing.assert_allclose(result.outputs[step][layer][0], expect, rtol=1e-4, atol=1e-5)
    if -(-total // case.page_size) > max(1, config["token_budget"] // case.page_size) and \
            config["dense_layers"] < case.num_layers:
        assert num_sparse > 0  # the trial exercised the sparse path
    assert result.resident_pages == result.reported_pages


def test_quest_rejects_unknown_keys(tmp_path):
    case = fh.Case(prefill_len=20, decode_steps=1).generate()
    with pytest.raises(subprocess.CalledProcessError):
        fh.run("quest", {"token_budget": 64, "skip_layers": 2}, case, tmp_path)
