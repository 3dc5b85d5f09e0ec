"""h2o against its oracle (oracles/h2o.py) on randomized fp32 inputs, step by step (chunked prefill, then decode
steps that keep evicting): per (layer, KV head) the kept positions and the accumulated scores (within 1e-4
relative) after every step, every step's attention output against dense causal attention over what the stream
held while attending, and the pages held against the method's memory model."""
import subprocess

import numpy as np
import pytest

import fidelity_harness as fh
from oracles import h2o as oracle


def random_trial(seed):
    rng = np.random.default_rng(2000 + seed)
    group = 4 if seed % 2 == 0 else 1
    num_kv_heads = int(rng.integers(1, 3))
    prefill_len = int(rng.integers(24, 160))
    num_chunks = int(rng.integers(1, 5))
    cuts = sorted(rng.choice(np.arange(1, prefill_len), size=num_chunks - 1, replace=False).tolist())
    chunks = [b - a for a, b in zip([0] + cuts, cuts + [prefill_len])]
    decode_steps = int(rng.integers(4, 24))
    if seed % 3 == 2:   # budget above the prompt: the first evictions come from decode steps
        budget = int(rng.integers(prefill_len, prefill_len + decode_steps))
    else:
        budget = int(rng.integers(2, prefill_len - 4))
    kind = seed % 5
    if kind == 0:
        config = {"budget": budget}                                     # default split: heavy = recent = budget/2
        heavy = budget // 2
    elif kind == 1:
        config = {"budget": budget, "heavy_ratio": float(rng.uniform(0, 1))}
        heavy = int(budget * config["heavy_ratio"])
    elif kind == 2:
        heavy = int(rng.integers(0, budget + 1))
        config = {"heavy": heavy, "recent": budget - heavy}
    elif kind == 3:
        heavy = int(rng.integers(0, budget + 1))
        config = {"budget": budget, "heavy": heavy}
    else:
        heavy = int(rng.integers(0, budget + 1))
        config = {"budget": budget, "recent": budget - heavy, "gqa_agg": str(rng.choice(["max", "sum"]))}
    case = fh.Case(num_layers=2, num_heads=num_kv_heads * group, num_kv_heads=num_kv_heads,
                   head_dim=int(rng.choice([16, 32])), page_size=int(rng.choice([4, 8, 16])),
                   prefill_len=prefill_len, prefill_chunks=chunks, decode_steps=decode_steps, seed=seed)
    return case.generate(), config, heavy, budget - heavy, config.get("gqa_agg", "mean")


def by_position(positions, acc):
    """A stream's positions and scores in position order: decode steps refill the evicted slot with the newest
    token, so slot order is not position order."""
    order = np.argsort(positions, kind="stable")
    return [positions[i] for i in order], np.asarray(acc)[order]


@pytest.mark.parametrize("seed", range(120))
def test_h2o_matches_oracle(seed, tmp_path):
    case, config, heavy, recent, gqa_agg = random_trial(seed)
    result = fh.run("h2o", config, case, tmp_path)
    scale = 1 / np.sqrt(case.head_dim)
    group = case.num_heads // case.num_kv_heads
    streams = [[oracle.Stream() for _ in range(case.num_kv_heads)] for _ in range(case.num_layers)]
    position = 0
    evicted = False
    refilled = False
    for step, n in enumerate(case.steps()):
        state = result.states[step]
        for layer in range(case.num_layers):
            keys, values = case.all_keys(layer), case.all_values(layer)
            for h, stream in enumerate(streams[layer]):
                out, rows = oracle.step(stream, case.q[step][layer], keys, values, h, position, heavy, recent,
                                        scale, gqa_agg)
                evicted = evicted or rows is not None
                where = f"step {step} layer {layer} head {h}"
                np.testing.assert_allclose(result.outputs[step][layer][:, h * group:(h + 1) * group], out,
                                           rtol=1e-4, atol=1e-5, err_msg=where)
                positions, acc = by_position(result.kept[step][layer][h], state["acc"][layer][h])
                assert positions == stream.positions, where
                np.testing.assert_allclose(acc, stream.acc, rtol=1e-4, atol=1e-6, err_msg=where)
                # What the eviction dropped, with the scores it was dropped by.
                dropped = sorted(state["dropped"][layer][h])
                assert [p for p, _ in dropped] == [p for p, _ in stream.dropped], where
                np.testing.assert_allclose([a for _, a in dropped], [a for _, a in stream.dropped], rtol=1e-4,
                                           atol=1e-6, err_msg=where)
                # A decode step one token over the budget moves the new token into the evicted one's slot and
                # leaves every other slot as it was.
                previous = result.kept[step - 1][layer][h] if step > 0 else []
                if n == 1 and len(previous) == heavy + recent:
                    (gone,) = (set(previous) | {position}) - set(stream.positions)
                    assert result.kept[step][layer][h] == [position if p == gone else p for p in previous], where
                    refilled = True
        position += n
        assert result.resident_pages[step] == oracle.resident_pages(
            case.num_layers, case.num_kv_heads, case.page_size, position, heavy, recent, n == 1)
        # As for StreamingLLM: the memory model counts the spare whenever the stream is over its budget.
        assert result.reported_pages[step] >= result.resident_pages[step]
        if n == 1 or position <= heavy + recent:
            assert result.reported_pages[step] == result.resident_pages[step]
    assert evicted and refilled


@pytest.mark.parametrize("seed", range(24))
def test_h2o_sliding_window_layers_keep_their_visible_tail(seed, tmp_path):
    """A Gemma-3-style layer with a sliding window W keeps the newest min(heavy + recent, W - 1) tokens, no heavy
    hitters it cannot see (sliding_window_tail.h): its outputs and scores follow attention by position within the
    window. The full-attention layer keeps heavy hitters + recent as before."""
    case, config, heavy, recent, gqa_agg = random_trial(seed)
    case.sliding_windows = [int(np.random.default_rng(6000 + seed).integers(4, 48)), 0]
    result = fh.run("h2o", config, case, tmp_path)
    scale = 1 / np.sqrt(case.head_dim)
    group = case.num_heads // case.num_kv_heads
    streams = [[oracle.Stream() for _ in range(case.num_kv_heads)] for _ in range(case.num_layers)]
    position = 0
    for step, n in enumerate(case.steps()):
        for layer, window in enumerate(case.sliding_windows):
            keys, values = case.all_keys(layer), case.all_values(layer)
            for h, stream in enumerate(streams[layer]):
                out, _ = oracle.step(stream, case.q[step][layer], keys, values, h, position, heavy, recent, scale,
                                     gqa_agg, window=window)
                where = f"step {step} layer {layer} head {h}"
                np.testing.assert_allclose(result.outputs[step][layer][:, h * group:(h + 1) * group], out,
                                           rtol=1e-4, atol=1e-5, err_msg=where)
                positions, acc = by_position(result.kept[step][layer][h], result.states[step]["acc"][layer][h])
                assert positions == stream.positions, where
                np.testing.assert_allclose(acc, stream.acc, rtol=1e-4, atol=1e-6, err_msg=where)
        position += n
        assert result.reported_pages[step] >= result.resident_pages[step]


@pytest.mark.parametrize("config", [{"heavy": 3, "heavy_ratio": 0.5}, {"budget": 8, "heavy": 3, "recent": 4},
                                    {"budget": 8, "recent": 9}, {"heavy": 0, "recent": 0},
                                    {"gqa_agg": "median"}, {"hh_size": 4}])
def test_h2o_rejects_bad_config(config, tmp_path):
    case = fh.Case(num_layers=1, prefill_len=8, seed=0).generate()
    with pytest.raises(subprocess.CalledProcessError):
        fh.run("h2o", config, case, tmp_path)
