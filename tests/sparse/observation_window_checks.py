"""Shared trial generation and checks of the observation-window eviction tests (snapkv, pyramidkv, adakv,
chunkkv): random fp32 cases with chunked and whole prefills, GQA groups 4 and 1, decode steps after the
compression; every step's kept positions per (layer, KV head) against the oracle's (prompt part) plus the decode
tokens, every decode step's attention output against dense attention over exactly those tokens, and the pages
held against the streams' lengths and against the method's memory model."""

import numpy as np

import fidelity_harness as fh

from oracles.common import attention_over


def random_case(rng, seed, num_layers=None, min_tokens=40, max_tokens=320, sharpen_heads=False):
    """A random case: prompt length, chunking (a third of the trials in one piece), GQA group, layers, pages.
    sharpen_heads: every KV head's keys are scaled by its own random factor in [1, 4], so the heads' attention
    ranges from spread to concentrated (what makes an adaptive split across heads uneven)."""
    group = 4 if seed % 2 == 0 else 1
    num_kv_heads = int(rng.integers(1, 4))
    prefill_len = int(rng.integers(min_tokens, max_tokens))
    chunks = []
    if seed % 3 != 0:
        num_chunks = int(rng.integers(2, 5))
        cuts = sorted(rng.choice(np.arange(1, prefill_len), size=num_chunks - 1, replace=False).tolist())
        if seed % 3 == 2:  # a last chunk shorter than most windows: the window spans several chunks
            cuts[-1] = max(cuts[-1], prefill_len - int(rng.integers(1, 8)))
            cuts = sorted(set(cuts))
        chunks = [b - a for a, b in zip([0] + cuts, cuts + [prefill_len])]
    case = fh.Case(num_layers=num_layers or int(rng.integers(1, 4)), num_heads=num_kv_heads * group,
                   num_kv_heads=num_kv_heads, head_dim=int(rng.choice([16, 32])),
                   page_size=int(rng.choice([4, 8, 16])), prefill_len=prefill_len, prefill_chunks=chunks,
                   decode_steps=int(rng.integers(2, 6)), seed=seed).generate()
    if sharpen_heads:
        scales = rng.uniform(1, 4, size=num_kv_heads).astype(np.float32)
        for step_keys in case.k:
            for layer_keys in step_keys:
                layer_keys *= scales[None, :, None]
    return case


def random_score_config(rng):
    """Random pooling / GQA reduction settings (kernel, pooling, gqa_agg, gqa_order)."""
    return {"kernel": int(rng.choice([1, 3, 5, 7])), "pooling": str(rng.choice(["avgpool", "maxpool"])),
            "gqa_agg": str(rng.choice(["mean", "max", "sum"])),
            "gqa_order": str(rng.choice(["pool_then_reduce", "reduce_then_pool"]))}


def check(case, result, prompt_kept, exact_pages=True):
    """prompt_kept: [layer][kv_head] kept prompt positions (ascending), or None when nothing is evicted."""
    if prompt_kept is None:
        prompt_kept = [[list(range(case.prefill_len))] * case.num_kv_heads] * case.num_layers
    scale = 1 / np.sqrt(case.head_dim)
    num_prefill_steps = len(case.prefill_chunks or [case.prefill_len])
    position = 0
    for step, n in enumerate(case.steps()):
        position += n
        want = [[list(range(position)) if step < num_prefill_steps - 1
                 else prompt + list(range(case.prefill_len, position)) for prompt in layer] for layer in prompt_kept]
        for layer in range(case.num_layers):
            for h in range(case.num_kv_heads):
                assert result.kept[step][layer][h] == want[layer][h], f"step {step} layer {layer} kv head {h}"
            if step >= num_prefill_steps:  # decode: one query against what the streams hold
                got = result.outputs[step][layer][0]
                dense = attention_over(case.q[step][layer][0], case.all_keys(layer), case.all_values(layer),
                                       want[layer], scale)
                np.testing.assert_allclose(got, dense, rtol=1e-4, atol=1e-5, err_msg=f"step {step} layer {layer}")
        held = sum(-(-len(stream) // case.page_size) for layer in want for stream in layer)
        assert result.resident_pages[step] == held, f"step {step}"
    if exact_pages:
        assert result.reported_pages == result.resident_pages
    else:  # an upper bound once compressed, exact while every token is resident
        for step in range(len(case.steps())):
            assert result.reported_pages[step] >= result.resident_pages[step], f"step {step}"
            if step < num_prefill_steps - 1:
                assert result.reported_pages[step] == result.resident_pages[step], f"step {step}"
