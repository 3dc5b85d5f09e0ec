"""chunkkv against its oracle (oracles/chunkkv.py) on randomized fp32 inputs: per layer the kept chunks (the
window's chunks plus the best-scoring prefix chunks, the same for every KV head) for random budgets, windows,
chunk lengths (partial last chunks included), pooling and GQA reductions (and the kvpress defaults); decode steps
attend exactly to the kept set plus the new tokens; the pages held equal the memory model's."""
import numpy as np
import pytest

import fidelity_harness as fh
from observation_window_checks import check, random_case, random_score_config
from oracles.chunkkv import chunkkv_kept, num_kept_tokens

DEFAULTS = {"window": 64, "kernel": 5, "pooling": "avgpool", "gqa_agg": "mean", "gqa_order": "pool_then_reduce",
            "chunk_length": 20}


def random_trial(seed):
    rng = np.random.default_rng(6000 + seed)
    if seed % 8 == 0:  # the defaults (chunks of 20, window 64, kvpress SnapKV scores); only the budget is set
        case = random_case(rng, seed, min_tokens=100, max_tokens=360)
        config = {"budget": int(rng.integers(65, case.prefill_len))}
    else:
        case = random_case(rng, seed)
        config = {"window": int(rng.integers(1, 24)), "chunk_length": int(rng.choice([1, 3, 8, 20, 32])),
                  **random_score_config(rng)}
        if seed % 10 == 9:  # budget at or above the prompt: nothing is evicted
            config["budget"] = max(case.prefill_len + int(rng.integers(0, 8)), config["window"] + 1)
        else:
            config["budget"] = int(rng.integers(config["window"] + 1, case.prefill_len))
    return case, config, {**DEFAULTS, **config}


@pytest.mark.parametrize("seed", range(120))
def test_chunkkv_matches_oracle(seed, tmp_path):
    case, config, full = random_trial(seed)
    result = fh.run("chunkkv", config, case, tmp_path)
    score_config = {k: full[k] for k in ("kernel", "pooling", "gqa_agg", "gqa_order")}
    kept = chunkkv_kept(case, full["budget"], full["window"], full["chunk_length"], **score_config)
    if kept is not None:
        assert len(kept[0][0]) == num_kept_tokens(case.prefill_len, full["budget"], full["window"],
                                                  full["chunk_length"])
    check(case, result, kept)
