"""snapkv against its oracle (oracles/snapkv.py) on randomized fp32 inputs: after the prompt (whole or chunked,
the window spanning chunks in some trials), the kept positions per (layer, KV head) equal the oracle's top
budget - window pooled window scores plus the window, for random budgets, windows, kernels, pooling and GQA
reductions (and the defaults); decode steps attend exactly to the kept set plus the new tokens; the pages held
equal the memory model's."""
import numpy as np
import pytest

import fidelity_harness as fh
from observation_window_checks import check, random_case, random_score_config
from oracles.common import attention_by_position, sliding_tail
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


@pytest.mark.parametrize("seed", range(24))
def test_snapkv_sliding_window_layers_keep_their_visible_tail(seed, tmp_path):
    """A Gemma-3-style layer with a sliding window W keeps as many prompt tokens as SnapKV's budget, but the newest
    it can see: min(budget, W - 1) (sliding_window_tail.h). Decode steps then read exactly the last W positions.
    Full-attention layers keep SnapKV's choice."""
    case, config, full = random_trial(seed)
    windows = [int(np.random.default_rng(7000 + seed).integers(4, 48)) if layer % 2 == 0 else 0
               for layer in range(case.num_layers)]
    case.sliding_windows = windows
    result = fh.run("snapkv", config, case, tmp_path)
    score_config = {k: full[k] for k in ("kernel", "pooling", "gqa_agg", "gqa_order")}
    prompt_kept = snapkv_kept(case, full["budget"], full["window"], **score_config)
    if prompt_kept is None:
        prompt_kept = [[list(range(case.prefill_len))] * case.num_kv_heads] * case.num_layers
    else:
        prompt_kept = [[sliding_tail(case.prefill_len, w, full["budget"])] * case.num_kv_heads if w else heads
                       for w, heads in zip(windows, prompt_kept)]
    scale = 1 / np.sqrt(case.head_dim)
    num_prefill_steps = len(case.prefill_chunks or [case.prefill_len])
    for step in range(num_prefill_steps - 1, len(case.steps())):
        position = case.prefill_len + step - (num_prefill_steps - 1)
        for layer, window in enumerate(windows):
            want = [prompt + list(range(case.prefill_len, position)) for prompt in prompt_kept[layer]]
            assert result.kept[step][layer] == want, f"step {step} layer {layer}"
            if step >= num_prefill_steps:
                got = result.outputs[step][layer]
                group = case.num_heads // case.num_kv_heads
                for h in range(case.num_kv_heads):
                    idx = np.asarray(want[h])
                    heads = slice(h * group, (h + 1) * group)
                    dense = attention_by_position(case.q[step][layer][:, heads], [position - 1],
                                                  case.all_keys(layer)[idx, h:h + 1],
                                                  case.all_values(layer)[idx, h:h + 1], idx, scale, window)
                    np.testing.assert_allclose(got[:, heads], dense, rtol=1e-4, atol=1e-5,
                                               err_msg=f"step {step} layer {layer} head {h}")
        assert result.reported_pages[step] >= result.resident_pages[step]
