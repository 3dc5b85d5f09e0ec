"""Quest (E2E kernel path) page selection, written from METHODS.md "Quest": per page the elementwise min and max of
its keys; a page's score for query head h is sum_d max(q_d * min_d, q_d * max_d); the group's scores are reduced to
its KV head (gqa_agg); page budget = token_budget // page_size counts the last page, which is always attended, and
the best (budget - 1) of the other pages join it; a stream of at most `budget` pages attends densely. Layers below
dense_layers and prefill are dense."""
import numpy as np

from oracles.common import reduce_group


def page_bounds(keys, page_size):
    """keys [T, Hkv, D] -> (min, max), each [Hkv, num_pages, D]; the last page may be partial."""
    num_pages = -(-keys.shape[0] // page_size)
    pages = [keys[p * page_size:(p + 1) * page_size] for p in range(num_pages)]
    lo = np.stack([page.min(axis=0) for page in pages], axis=1)
    hi = np.stack([page.max(axis=0) for page in pages], axis=1)
    return lo, hi


def bound_scores(q, keys, page_size):
    """Upper bounds of q.k per page: q [H, D], keys [T, Hkv, D] -> [H, num_pages] (float64)."""
    group = q.shape[0] // keys.shape[1]
    lo, hi = page_bounds(keys.astype(np.float64), page_size)
    lo, hi = np.repeat(lo, group, axis=0), np.repeat(hi, group, axis=0)  # [H, num_pages, D]
    qq = q.astype(np.float64)[:, None, :]
    return np.maximum(lo * qq, hi * qq).sum(axis=2)


def select_pages(q, keys, page_size, token_budget, gqa_agg="mean"):
    """One decode step of one sparse layer: q [H, D] (the new token), keys [T, Hkv, D] (all stored keys, the new one
    included). Returns None when the layer attends densely, else per KV head the ascending selected page indices."""
    num_pages = -(-keys.shape[0] // page_size)
    budget = max(1, token_budget // page_size)
    if num_pages <= budget:
        return None
    scores = reduce_group(bound_scores(q, keys, page_size), keys.shape[1], gqa_agg)  # [Hkv, num_pages]
    selected = []
    for head_scores in scores:
        others = np.argsort(-head_scores[:-1], kind="stable")[:budget - 1]
        selected.append(sorted(int(p) for p in others) + [num_pages - 1])
    return selected


def pages_to_tokens(pages, page_size, num_tokens):
    """Token indices of the given pages of a stream of num_tokens tokens."""
    return [t for p in pages for t in range(p * page_size, min((p + 1) * page_size, num_tokens))]
