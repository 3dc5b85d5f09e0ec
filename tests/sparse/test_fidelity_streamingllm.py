"""streamingllm against its oracle (oracles/streamingllm.py) on randomized fp32 inputs: after every step (chunked
prefill and decode) each (layer, KV head) stream keeps exactly the sinks + recent window, every step's attention
output equals dense causal attention over what the stream held while attending, and the pages held equal the
method's memory model."""
import subprocess

import numpy as np
import pytest

import fidelity_harness as fh
from oracles import streamingllm as oracle

from oracles.common import attention_by_position, window_probs


def random_trial(seed):
    """A case plus a config whose budget falls inside the prefill (eviction during prefill and decode) or, for a
    third of the trials, inside the decode phase only."""
    rng = np.random.default_rng(1000 + seed)
    group = 4 if seed % 2 == 0 else 1
    num_kv_heads = int(rng.integers(1, 3))
    prefill_len = int(rng.integers(24, 160))
    num_chunks = int(rng.integers(1, 5))
    cuts = sorted(rng.choice(np.arange(1, prefill_len), size=num_chunks - 1, replace=False).tolist())
    chunks = [b - a for a, b in zip([0] + cuts, cuts + [prefill_len])]
    decode_steps = int(rng.integers(4, 24))
    sinks = int(rng.choice([0, 1, 4, int(rng.integers(2, 9))]))
    if seed % 3 == 2:   # budget above the prompt: the first evictions come from decode steps
        budget = int(rng.integers(prefill_len, prefill_len + decode_steps))
    else:
        budget = int(rng.integers(sinks + 1, max(sinks + 2, prefill_len - 4)))
    case = fh.Case(num_layers=2, num_heads=num_kv_heads * group, num_kv_heads=num_kv_heads,
                   head_dim=int(rng.choice([16, 32])), page_size=int(rng.choice([4, 8, 16])),
                   prefill_len=prefill_len, prefill_chunks=chunks, decode_steps=decode_steps, seed=seed)
    return case.generate(), {"budget": budget, "sink_tokens": sinks}


@pytest.mark.parametrize("seed", range(120))
def test_streamingllm_matches_oracle(seed, tmp_path):
    case, config = random_trial(seed)
    result = fh.run("streamingllm", config, case, tmp_path)
    attended, kept = oracle.simulate(case.steps(), config["budget"], config["sink_tokens"])
    scale = 1 / np.sqrt(case.head_dim)
    group = case.num_heads // case.num_kv_heads
    total = 0
    evicted = False
    ringed = False
    for step, n in enumerate(case.steps()):
        total += n
        evicted = evicted or len(attended[step]) > len(kept[step])
        for layer in range(case.num_layers):
            heads = result.kept[step][layer]
            assert [sorted(h) for h in heads] == [kept[step]] * case.num_kv_heads, (step, layer)
            # A decode step one token over the budget moves the new token into the evicted one's slot and leaves
            # every other slot as it was (the ring of evict_slots).
            if n == 1 and step > 0 and len(result.kept[step - 1][layer][0]) == config["budget"]:
                (gone,) = set(attended[step]) - set(kept[step])
                assert heads == [[total - 1 if p == gone else p for p in h] for h in result.kept[step - 1][layer]]
                ringed = True
            # Attention of the step: its n queries over the resident rows + its own, causal in stream order.
            idx = np.asarray(attended[step])
            keys, values = case.all_keys(layer)[idx], case.all_values(layer)[idx]
            probs = window_probs(case.q[step][layer], keys, scale)                 # [H, n, len]
            want = np.einsum("hnt,thd->nhd", probs, np.repeat(values.astype(np.float64), group, axis=1))
            np.testing.assert_allclose(result.outputs[step][layer], want, rtol=1e-4, atol=1e-5)
        assert result.resident_pages[step] == oracle.resident_pages(
            case.num_layers, case.num_kv_heads, case.page_size, total, config["budget"], n == 1)
        # The method's memory model counts the spare whenever the stream is over its budget: what the next step
        # holds at its peak. Exact after one-token steps and below the budget, one page a stream over after a
        # compacting prefill chunk.
        assert result.reported_pages[step] >= result.resident_pages[step]
        if n == 1 or total <= config["budget"]:
            assert result.reported_pages[step] == result.resident_pages[step]
    assert evicted
    assert ringed


@pytest.mark.parametrize("seed", range(24))
def test_streamingllm_sliding_window_layers_keep_their_visible_tail(seed, tmp_path):
    """A Gemma-3-style layer with a sliding window W keeps the newest min(budget, W - 1) tokens and no sinks
    (sliding_window_tail.h): the W slots attention reads are then the W latest positions, so every step's output
    equals attention by position within the window. The full-attention layer keeps sinks + recent as before."""
    case, config = random_trial(seed)
    case.sliding_windows = [int(np.random.default_rng(5000 + seed).integers(4, 48)), 0]
    result = fh.run("streamingllm", config, case, tmp_path)
    scale = 1 / np.sqrt(case.head_dim)
    for layer, window in enumerate(case.sliding_windows):
        attended, kept = oracle.simulate(case.steps(), config["budget"], config["sink_tokens"], window)
        keys, values = case.all_keys(layer), case.all_values(layer)
        position = 0
        for step, n in enumerate(case.steps()):
            assert [sorted(h) for h in result.kept[step][layer]] == [kept[step]] * case.num_kv_heads, (step, layer)
            idx = np.asarray(attended[step])
            want = attention_by_position(case.q[step][layer], range(position, position + n), keys[idx], values[idx],
                                         idx, scale, window)
            np.testing.assert_allclose(result.outputs[step][layer], want, rtol=1e-4, atol=1e-5,
                                       err_msg=f"step {step} layer {layer}")
            position += n
    for step in range(len(case.steps())):  # the memory model does not count the shorter sliding streams
        assert result.reported_pages[step] >= result.resident_pages[step]


@pytest.mark.parametrize("config", [{"budget": 4, "sink_tokens": 4}, {"sink_tokens": -1}, {"window": 3}])
def test_streamingllm_rejects_bad_config(config, tmp_path):
    case = fh.Case(num_layers=1, prefill_len=8, seed=0).generate()
    with pytest.raises(subprocess.CalledProcessError):
        fh.run("streamingllm", config, case, tmp_path)
