"""OmniKV ("last" selector), written from METHODS.md "OmniKV": layer roles from the filter layers, and the index a
filter layer picks at each decode step: prompt tokens ranked by the raw logit q_h.k_j/sqrt(d) maxed over every query
head (the filter layer's own q for the new token and its own keys at positions < prefill_len), top N kept, one index
for every head. Sparse layers attend those prompt tokens plus every token after the prompt."""
import numpy as np


def layer_roles(num_layers, filter_layers, num_wait):
    """-> (roles, sources): roles[l] in {"dense", "filter", "sparse"}; sources[l] = the filter layer whose index a
    sparse layer reads (None otherwise). Filter layers outside the model are ignored; with none left, all dense."""
    filters = sorted({f for f in filter_layers if f < num_layers})
    roles, sources = ["dense"] * num_layers, [None] * num_layers
    if not filters:
        return roles, sources
    full = list(range(filters[0])) + filters + [num_layers]
    for l, r in zip(full[:-1], full[1:]):
        # l .. l + num_wait run dense (the filter layer and the layers that wait for its index), the rest sparse.
        for x in range(l + num_wait + 1, r):
            roles[x], sources[x] = "sparse", l
        if l + num_wait + 1 < r:
            roles[l] = "filter"
    return roles, sources


def num_kept(prefill_len, num_selected_tokens=None, selected_fraction=None):
    n = int(selected_fraction * prefill_len) if selected_fraction else num_selected_tokens
    return min(n, prefill_len)


def select_prompt_tokens(q, keys, prefill_len, n):
    """q [H, D] (the filter layer's new query), keys [T, Hkv, D] -> ascending indices of the top-n prompt tokens."""
    num_heads, num_kv_heads, head_dim = q.shape[0], keys.shape[1], q.shape[1]
    group = num_heads // num_kv_heads
    k = np.repeat(keys[:prefill_len].astype(np.float64), group, axis=1)  # [P, H, D]
    logits = np.einsum("hd,phd->hp", q.astype(np.float64), k) / np.sqrt(head_dim)
    score = logits.max(axis=0)
    return sorted(int(j) for j in np.argsort(-score, kind="stable")[:n])


def sparse_tokens(index, prefill_len, num_tokens):
    """What a sparse layer attends: the filter layer's prompt tokens, then the decode tail."""
    return list(index) + list(range(prefill_len, num_tokens))
