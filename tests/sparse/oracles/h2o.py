"""H2O (real-drop) oracle, written from METHODS.md ("H2O") and the engine's step semantics.

Per (layer, KV head) stream: a list of resident original positions and an accumulated score `acc` aligned with it.
A step of n tokens (a prefill chunk, a whole prompt or one decode token) appends its tokens, then its n queries
attend causally over the resident keys plus their own (query r sees stream rows <= len - n + r). Each query head's
softmax (fp32 or better) is summed over the n rows; the query group is reduced to its KV head (mean by default, our
GQA choice); acc grows by n zeros and adds that column sum. After the step, a stream with len > heavy + recent
keeps the `heavy` rows of largest acc among the first len - recent (ties: lower row) plus the last `recent`, and
acc is compacted alongside. The engine does this in finish_step; the reference does it inside attention, right
after the softmax, which is the same for every layer since layers do not share state."""
import numpy as np

from oracles.common import probs_by_position, ring_stream_pages, sliding_tail

GROUP_REDUCE = {"mean": np.mean, "max": np.max, "sum": np.sum}


class Stream:
    def __init__(self):
        self.positions = []          # original positions of the resident rows, in stream order
        self.acc = np.zeros(0)       # float64, aligned with positions
        self.dropped = []            # (position, acc) of the rows the last step's eviction dropped


def heavy_hitters(acc, num_heavy, num_candidates):
    """Rows of the num_heavy largest acc among rows [0, num_candidates); lower row first on ties. Ascending."""
    order = sorted(range(num_candidates), key=lambda j: (-acc[j], j))
    return sorted(order[:num_heavy])


def step(stream, q, keys, values, kv_head, first_position, heavy, recent, scale, gqa_agg="mean", choose=None,
         window=0):
    """Runs one step of n = len(q) tokens on one stream. q [n, H, D] (all query heads of the step), keys/values
    [T, Hkv, D] indexed by original position. Returns (out [n, G, D] for the group's query heads, the rows kept
    by the eviction or None). `choose(acc, heavy, num_candidates)` overrides heavy_hitters (tie handling). On a
    sliding-window layer (window > 0) queries see the last `window` positions and an eviction keeps the stream's
    visible tail (common.sliding_tail)."""
    n, num_heads, _ = q.shape
    num_kv_heads = keys.shape[1]
    group = num_heads // num_kv_heads
    stream.positions = stream.positions + list(range(first_position, first_position + n))
    idx = np.asarray(stream.positions)
    heads = slice(kv_head * group, (kv_head + 1) * group)
    probs = probs_by_position(q[:, heads], range(first_position, first_position + n),
                              keys[idx, kv_head:kv_head + 1], idx, scale, window)   # [G, n, len]
    out = np.einsum("gnt,td->ngd", probs, values[idx, kv_head].astype(np.float64))
    column_sums = GROUP_REDUCE[gqa_agg](probs.sum(axis=1), axis=0)            # [len]
    stream.acc = np.concatenate([stream.acc, np.zeros(n)]) + column_sums
    length = len(stream.positions)
    stream.dropped = []
    if length <= heavy + recent:
        return out, None
    if window:
        rows = sliding_tail(length, window, heavy + recent)
    else:
        rows = (choose or heavy_hitters)(stream.acc, heavy, length - recent) + list(range(length - recent, length))
    kept = set(rows)
    stream.dropped = [(stream.positions[j], stream.acc[j]) for j in range(length) if j not in kept]
    stream.positions = [stream.positions[j] for j in rows]
    stream.acc = stream.acc[rows]
    return out, rows


def resident_pages(num_layers, num_kv_heads, page_size, num_tokens, heavy, recent, one_token_step):
    return num_layers * num_kv_heads * ring_stream_pages(page_size, num_tokens, heavy + recent, one_token_step)
