"""SnapKV oracle, written from METHODS.md ("SnapKV", "0. Cross-cutting rules"); the observation-window scoring
here is shared by the PyramidKV, AdaKV and ChunkKV oracles.

Once the whole prompt of T tokens is in, per layer: the last w prompt queries (post-RoPE) take a causal softmax
over all T keys (float64 here); its mean over those w rows is kept for the prefix tokens j < T - w only. The
prefix scores are smoothed along the tokens (stride 1, padding k // 2; avg counts the zero padding, max pads with
-inf) and each KV head's query group is reduced (mean / max / sum), after pooling (kvpress) or before it
(KVCache-Factory kv_head mode, AdaKV). Each (layer, KV head) then keeps the prefix tokens with the largest scores
(ties: lower index), plus the w window tokens. Nothing is evicted when T <= budget."""
import numpy as np

from oracles.common import pool1d, reduce_group, window_probs


def window_scores(window_q, keys, scale, window, kernel=5, pooling="avgpool", gqa_agg="mean",
                  gqa_order="pool_then_reduce"):
    """window_q [w, H, D] (the prompt's last w queries), keys [T, Hkv, D] (the whole prompt) -> [Hkv, T - w]."""
    num_tokens, num_kv_heads, _ = keys.shape
    probs = window_probs(window_q, keys, scale)               # [H, w, T]
    mean = probs.mean(axis=1)[:, : num_tokens - window]       # [H, T - w]
    if gqa_order == "pool_then_reduce":
        return reduce_group(pool1d(mean, kernel, pooling), num_kv_heads, gqa_agg)
    return pool1d(reduce_group(mean, num_kv_heads, gqa_agg), kernel, pooling)


def order_desc(scores):
    """Indices by descending score, ties by ascending index."""
    return np.lexsort((np.arange(len(scores)), -np.asarray(scores)))


def top_k(scores, k):
    """The k indices of largest score (ties: lower index), ascending."""
    return sorted(int(i) for i in order_desc(scores)[:k])


def case_scores(case, layer, window, **score_config):
    """Window scores of `layer` for a fidelity_harness.Case whose prompt ends at case.prefill_len."""
    keys = case.all_keys(layer)[: case.prefill_len]
    window_q = case.prefill_queries(layer)[-window:]
    return window_scores(window_q, keys, 1 / np.sqrt(case.head_dim), window, **score_config)


def kept_positions(scores, num_tokens, window, num_prefix_kept):
    """Per KV head: the top num_prefix_kept prefix positions plus the window, ascending."""
    window_positions = list(range(num_tokens - window, num_tokens))
    return [top_k(head, num_prefix_kept) + window_positions for head in scores]


def snapkv_kept(case, budget, window, **score_config):
    """[layer][kv_head] kept prompt positions after SnapKV, or None per layer when the prompt is not compressed."""
    if case.prefill_len <= budget:
        return None
    return [kept_positions(case_scores(case, layer, window, **score_config), case.prefill_len, window,
                           budget - window) for layer in range(case.num_layers)]


def pages(kept_lengths, page_size):
    """Pages held by streams of the given lengths."""
    return sum(-(-n // page_size) for n in kept_lengths)
