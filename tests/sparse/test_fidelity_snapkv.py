"""snapkv against its oracle (oracles/snapkv.py) on randomized fp32 inputs: after the prompt (whole or chunked,
the window spanning chunks in some trials), the kept positions per (layer, KV head) equal the oracle's top
budget - window pooled window scores plus the window, for random budgets, windows, kernels, pooling and GQA
reductions (and the defaults); decode steps attend exactly to the kept set plus the new tokens; the pages held
equal the memory model's."""
import numpy as np
import pytest

import fidelity_harness as fh
from observation_window_checks import check, random_case, random_score_config
from oracles.snapkv import snapkv_kept

DEFAULTS = {"window": 64, "kernel": 5, "pooling": "avgpool", "gqa_agg": "mean", "gqa_order": "pool_then_reduce"}


def random_trial(seed):
    rng = np.random.default_rng(3000 + seed)
    if seed % 8 == 0:  # the defaults (window 64, kernel 5, avgpool, mean after pooling); only the budget is set
        case = random_case(rng, seed, min_tokens=100, max_tokens=360)
        config = {"budget": int(rng.integers(65, case.prefill_len))}
    else:
        case = random_case(rng, seed)
        config = {"window": int(rng.integers(1, 24)), **random_score_config(rng)}
        if seed % 10 == 9:  # budget at or above the prompt: nothing is evicted
            config["budget"] = max(case.prefill_len + int(rng.integers(0, 8)), config["window"] + 1)
        else:
            config["budget"] = int(rng.integers(config["window"] + 1, case.prefill_len))
    return case, config, {**DEFAULTS, **config}


@pytest.mark.parametrize("seed", range(120))
def test_snapkv_matches_oracle(seed, tmp_path):
    case, config, full = random_trial(seed)
    result = fh.run("snapkv", config, case, tmp_path)
    score_config = {k: full[k] for k in ("kernel", "pooling", "gqa_agg", "gqa_order")}
    check(case, result, snapkv_kept(case, full["budget"], full["window"], **score_config))
