"""adakv against its oracle (oracles/adakv.py) on randomized fp32 inputs, both variants: per layer the split of
the budget across KV heads (kvpress: the window and each head's forced top int(C alpha) - w, then the layer's
global top; adakv_reference: FFY0's cap_h plus the window), so heads end with different lengths, and per (layer,
KV head) the kept positions, for random budgets, windows, floor_alpha, pooling and GQA reductions and each
variant's defaults (kvpress: SnapKVPress's window 64, avgpool 5, pooled then averaged over the group; FFY0: window
mean, maxpool 7, group mean before pooling); alpha 0.2); decode steps attend exactly to each head's kept set plus
the new tokens; the pages held equal the streams' lengths and never exceed the memory model's bound (the split
depends on the scores, so the model is an upper bound once compressed)."""
import numpy as np
import pytest

import fidelity_harness as fh
from observation_window_checks import check, random_case, random_score_config
from oracles.adakv import SCORE_DEFAULTS, adakv_kept

NUM_TRIALS = 100  # per variant
SEED_BASE = {"kvpress": 8000, "adakv_reference": 5000}


def random_trial(seed, variant="kvpress"):
    rng = np.random.default_rng(SEED_BASE[variant] + seed)
    defaults = {**SCORE_DEFAULTS[variant], "floor_alpha": 0.2, "variant": variant}
    if variant == "kvpress":
        case = random_case(rng, seed, min_tokens=40, max_tokens=360, sharpen_heads=seed % 3 != 2)
        config = {}  # the default variant
    else:
        case = random_case(rng, seed)
        config = {"variant": variant}
    if seed % 8 == 0:  # the variant's scorer defaults; only the budget is set
        if case.prefill_len <= defaults["window"] + 8:
            config["window"] = 16
    else:
        config.update({"window": int(rng.integers(1, 24)), **random_score_config(rng)})
        if seed % 4 != 1:
            config["floor_alpha"] = float(rng.choice([0.0, 0.2, 0.5, 1.0, rng.uniform(0, 1)]))
    window = config.get("window", defaults["window"])
    if seed % 10 == 9:  # budget at or above the prompt: nothing is evicted
        config["budget"] = max(case.prefill_len + int(rng.integers(0, 8)), window + 1)
    else:
        config["budget"] = int(rng.integers(window + 1, case.prefill_len))
    return case, config, {**defaults, **config}


def expected(case, full):
    return adakv_kept(case, full["budget"], full["window"], full["floor_alpha"], full["variant"],
                      **{k: full[k] for k in ("kernel", "pooling", "gqa_agg", "gqa_order")})


@pytest.mark.parametrize("variant,seed", [(v, i) for v in ("kvpress", "adakv_reference") for i in range(NUM_TRIALS)])
def test_adakv_matches_oracle(variant, seed, tmp_path):
    case, config, full = random_trial(seed, variant)
    result = fh.run("adakv", config, case, tmp_path)
    check(case, result, expected(case, full), exact_pages=False)


@pytest.mark.parametrize("variant", ["kvpress", "adakv_reference"])
def test_heads_end_with_different_lengths(variant, tmp_path):
    """Adaptive allocation really is per head: some trial gives two KV heads of a layer different lengths."""
    for seed in range(1, 40):
        case, config, full = random_trial(seed, variant)
        if case.num_kv_heads < 2 or case.prefill_len <= full["budget"]:
            continue
        kept = expected(case, full)
        if any(len({len(head) for head in layer}) > 1 for layer in kept):
            result = fh.run("adakv", config, case, tmp_path)
            last = len(case.prefill_chunks or [case.prefill_len]) - 1
            assert any(len({len(head) for head in layer}) > 1 for layer in result.kept[last])
            return
    pytest.fail("no trial split a layer's budget unevenly")
