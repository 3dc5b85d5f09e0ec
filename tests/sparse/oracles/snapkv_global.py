"""snapkv_global prefix-pruning oracle (docs/architecture.md "Prefix pruning"; METHODS.md "SnapKV" for the window
scoring): one score per position, shared by every (layer, KV head).

For T tokens and a window of the last w: per layer, each query head's causal softmax rows of the w window queries
over all T keys are summed over those rows; the heads are averaged; the layers are summed. The positions before the
window are max-pooled along the tokens with kernel 7 (padding -inf); the window always stays. A range keeps its
top positions by that score (ties: the lower position)."""
import numpy as np

from oracles.common import pool1d, window_probs

KERNEL = 7


def snapkv_global_scores(window_queries, keys, scale):
    """window_queries[layer] [w, H, D], keys[layer] [T, Hkv, D] -> the pooled prefix scores [T - w] (float64)."""
    total = None
    for q, k in zip(window_queries, keys):
        per_head = window_probs(q, k, scale).sum(axis=1)  # [H, T]: summed over the window rows
        layer = per_head.mean(axis=0)
        total = layer if total is None else total + layer
    w = window_queries[0].shape[0]
    return pool1d(total[None, : keys[0].shape[0] - w], KERNEL, "maxpool")[0]


def keep_mask(scores, num_tokens, window, start, end, keep):
    """The `keep` best positions of [start, end) (the window's score +inf), ascending."""
    full = np.concatenate([scores, np.full(window, np.inf)])[:num_tokens]
    candidates = np.arange(start, end)
    order = candidates[np.lexsort((candidates, -full[start:end]))]
    return sorted(int(i) for i in order[:keep])
