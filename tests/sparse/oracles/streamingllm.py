"""StreamingLLM oracle, written from METHODS.md ("StreamingLLM") and the engine's step semantics.

Every stream keeps its first `sinks` tokens and its most recent `budget - sinks` tokens, identically for all layers
and KV heads. The engine evicts *after* each step (the reference's `kv_cache(past)` hook after a forward), so a
step of n tokens attends densely and causally over what the previous step left (at most `budget` tokens) plus its
own n tokens; only then does the stream shrink back to `budget`. Keys keep their original RoPE (no pos-shift), so
attention is plain softmax attention over the stored post-RoPE keys."""
import numpy as np

from oracles.common import ring_stream_pages, sliding_tail


def simulate(steps, budget, sinks, window=0):
    """Positions each stream attends to in each step and keeps after it.

    steps: tokens per step; window: the layer's sliding window (0 = full attention), where an eviction keeps the
    stream's visible tail instead (common.sliding_tail). Returns (attended, kept): per step, the ascending original
    positions resident while the step attends (its own tokens last) and the positions left once the step's
    eviction ran."""
    assert 0 <= sinks < budget
    resident = []
    position = 0
    attended, kept = [], []
    for n in steps:
        resident = resident + list(range(position, position + n))
        position += n
        attended.append(list(resident))
        if len(resident) > budget and window:
            resident = [resident[j] for j in sliding_tail(len(resident), window, budget)]
        elif len(resident) > budget:
            resident = resident[:sinks] + resident[len(resident) - (budget - sinks):]
        kept.append(list(resident))
    return attended, kept


def resident_pages(num_layers, num_kv_heads, page_size, num_tokens, budget, one_token_step):
    """Pages a sequence of num_tokens computed tokens holds: every stream keeps min(num_tokens, budget), and after
    a one-token step over a budget on a page boundary also the page that step opened (the stream's spare)."""
    return ring_stream_pages(page_size, num_tokens, budget, one_token_step) * num_layers * num_kv_heads

