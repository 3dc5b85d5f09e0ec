"""pyramidkv against its oracle (oracles/pyramidkv.py) on randomized fp32 inputs, both schedules: per layer the
kvpress budget (the default: float arithmetic, fractional budgets, the uniform fallback, the clipped and unclipped
pyramid, one layer keeping round(max)) and the KVCache-Factory prefix budget (no compression, uniform C - w, the
clipped and unclipped pyramid; 1 to 4 layers); per (layer, KV head) the kept positions = the oracle's top pooled
window scores plus the window; decode steps attend exactly to the kept set plus the new tokens; the pages held
equal the memory model's."""
import numpy as np
import pytest

import fidelity_harness as fh
from observation_window_checks import check, random_case, random_score_config
from oracles.pyramidkv import pyramidkv_kept

DEFAULTS = {"window": 64, "kernel": 5, "pooling": "avgpool", "gqa_agg": "mean", "gqa_order": "pool_then_reduce",
            "beta": 20, "schedule": "kvpress"}
NUM_TRIALS = 100  # per schedule


def random_layers(rng):
    return int(rng.choice([1, 2, 3, 4], p=[0.1, 0.3, 0.3, 0.3]))


def kvcache_factory_trial(seed):
    rng = np.random.default_rng(4000 + seed)
    case = random_case(rng, seed, num_layers=random_layers(rng))
    if seed % 8 == 0:
        window = 64 if case.prefill_len > 100 else int(rng.integers(1, 24))
        config = {"window": window}
    else:
        config = {"window": int(rng.integers(1, 24)), "beta": int(rng.choice([1, 2, 5, 20])),
                  **random_score_config(rng)}
    config["schedule"] = "kvcache_factory"
    window, num_tokens = config["window"], case.prefill_len
    regime = seed % 4
    if regime == 0 or num_tokens <= 2 * window + 2:  # uniform SnapKV budget: C < T < 2 (C - w), or none
        config["budget"] = int(rng.integers(max(window + 1, (num_tokens + 2 * window) // 2), num_tokens + 4))
    else:  # T >= 2 (C - w): the pyramid
        config["budget"] = int(rng.integers(window + 1, (num_tokens + 2 * window) // 2 + 1))
        if regime == 3 and "beta" in config:
            config["beta"] = int(rng.choice([5, 20]))  # a small (C - w) // beta lets max reach T - w
        beta = config.get("beta", 20)
        clipped = [base + window for base in range(1, num_tokens // 2 + 1)   # max = 2 base - base // beta >= T - w
                   if 2 * base - base // beta >= num_tokens - window and base + window < num_tokens]
        if regime == 3 and clipped:
            config["budget"] = int(rng.choice(clipped))
    return case, config, {**DEFAULTS, **config}


def kvpress_trial(seed):
    """kvpress schedule (the default, so `schedule` is left out). The regime (seed % 4) aims the budget C at:
    0 anything in (w, T + 4) (no compression at C >= T, mostly the fallback), 1 the unclipped pyramid
    (beta w <= C, 2 C - C / beta < T - w), 2 the clipped one (T / 2 <= C <= T - w), 3 kvpress's own
    C = T (1 - r) for a random r. Odd seeds make C fractional."""
    rng = np.random.default_rng(9000 + seed)
    case = random_case(rng, seed, num_layers=random_layers(rng), min_tokens=60, max_tokens=360)
    num_tokens = case.prefill_len
    if seed % 8 == 0 and num_tokens > 140:  # the defaults: window 64, kernel 5, avgpool, mean after pooling, beta 20
        config = {}
    else:
        config = {"window": int(rng.integers(1, 16)), "beta": int(rng.choice([1, 2, 5, 20])),
                  **random_score_config(rng)}
    window, beta = config.get("window", 64), config.get("beta", 20)
    regime = seed % 4
    low, high = window + 1, num_tokens + 4
    if regime == 1 and beta * window < (num_tokens - window) / (2 - 1 / beta):
        low, high = beta * window, int((num_tokens - window) / (2 - 1 / beta))
    elif regime == 2 and num_tokens // 2 < num_tokens - window:
        low, high = max(low, num_tokens // 2), num_tokens - window
    budget = float(rng.integers(low, max(low, high) + 1))
    if regime == 3:
        budget = num_tokens * (1 - float(rng.uniform(0.05, 0.95)))
        if budget <= window:
            budget = window + 1.5
    elif seed % 2 == 1:
        budget = max(window + 0.25, budget - float(rng.choice([0.5, 0.25, 0.75])))
    config["budget"] = budget if seed % 2 == 1 or regime == 3 else int(budget)
    return case, config, {**DEFAULTS, **config}


@pytest.mark.parametrize("schedule,seed", [(s, i) for s in ("kvpress", "kvcache_factory") for i in range(NUM_TRIALS)])
def test_pyramidkv_matches_oracle(schedule, seed, tmp_path):
    case, config, full = (kvpress_trial if schedule == "kvpress" else kvcache_factory_trial)(seed)
    result = fh.run("pyramidkv", config, case, tmp_path)
    score_config = {k: full[k] for k in ("kernel", "pooling", "gqa_agg", "gqa_order")}
    check(case, result, pyramidkv_kept(case, full["budget"], full["window"], full["beta"], full["schedule"],
                                       **score_config))
