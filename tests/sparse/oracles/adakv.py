"""AdaKV oracle, written from METHODS.md ("AdaKV"): SnapKV-style prefix scores per KV head, then the layer's
budget C (window w included) is split across its heads. Nothing is evicted when T <= C. Two variants:

* kvpress (the default; "kvpress variant", AdaKVPress over SnapKVPress scores: window 64, kernel 5, avgpool,
  pooled per query head then averaged over the group). Over the whole stream, the window scores sit above every
  prefix score; each head forces its top n_safe = int(C alpha) entries (at least 1 when alpha > 0) above
  everything, and the layer keeps the Hkv * C largest entries of all heads. Done literally here on [Hkv, T]
  scores: window entries = 1 + the largest prefix score, forced entries = +inf, then the global top Hkv * C
  (ties: lower head, then lower token).
* adakv_reference (FFY0/AdaKV with gqa_support: window 32, maxpool 7, the group reduced before pooling).
  With B = C - w: sort each head's scores descending, take the Hkv * B largest of all heads together (ties: lower
  head first), count n_h = how many came from head h; head h keeps its own top round(n_h (1 - alpha) + int(B
  alpha)) prefix tokens (round half to even) plus the window."""
import numpy as np

from oracles.snapkv import case_scores, order_desc, top_k

SCORE_DEFAULTS = {
    "kvpress": {"window": 64, "kernel": 5, "pooling": "avgpool", "gqa_agg": "mean", "gqa_order": "pool_then_reduce"},
    "adakv_reference": {"window": 32, "kernel": 7, "pooling": "maxpool", "gqa_agg": "mean",
                        "gqa_order": "reduce_then_pool"},
}


def head_capacities(scores, prefix_budget, floor_alpha):
    """adakv_reference: scores [Hkv, n] -> prefix tokens each head keeps."""
    num_heads, n = scores.shape
    # Flattened [head][rank] of each head's descending scores; the global order breaks ties by that position.
    ranked = np.stack([head[order_desc(head)] for head in scores]).reshape(-1)
    top = order_desc(ranked)[: min(num_heads * prefix_budget, num_heads * n)]
    counts = np.bincount(top // n, minlength=num_heads)
    floor_capacity = int(prefix_budget * floor_alpha)
    return [int(np.clip(np.round(c * (1 - floor_alpha) + floor_capacity), 0, n)) for c in counts]


def kvpress_kept_layer(scores, budget, window, floor_alpha):
    """kvpress: scores [Hkv, T - w] prefix scores -> per head the kept positions of the whole prompt."""
    num_heads, n = scores.shape
    num_tokens = n + window
    full = np.empty((num_heads, num_tokens))
    full[:, :n] = scores
    full[:, n:] = scores.max() + 1 if n else 1.0
    num_safe = int(budget * floor_alpha)
    if floor_alpha > 0:
        num_safe = max(1, num_safe)
    for head in full:
        forced = order_desc(head)[:num_safe]  # the window comes first (ties among it: any)
        head[forced] = np.inf
    keep = order_desc(full.reshape(-1))[: num_heads * budget]
    kept = [[] for _ in range(num_heads)]
    for flat in keep:
        kept[flat // num_tokens].append(int(flat % num_tokens))
    return [sorted(head) for head in kept]


def adakv_kept(case, budget, window, floor_alpha=0.2, variant="kvpress", **score_config):
    """[layer][kv_head] kept prompt positions, or None when the prompt is not compressed."""
    if case.prefill_len <= budget:
        return None
    config = {k: v for k, v in {**SCORE_DEFAULTS[variant], **score_config}.items() if k != "window"}
    window_positions = list(range(case.prefill_len - window, case.prefill_len))
    kept = []
    for layer in range(case.num_layers):
        scores = case_scores(case, layer, window, **config)
        if variant == "kvpress":
            kept.append(kvpress_kept_layer(scores, budget, window, floor_alpha))
            continue
        caps = head_capacities(scores, budget - window, floor_alpha)
        kept.append([top_k(head, cap) + window_positions for head, cap in zip(scores, caps)])
    return kept
