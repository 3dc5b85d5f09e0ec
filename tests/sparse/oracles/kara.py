"""Kara oracle, written from our interpretation of the seed's text (docs/fidelity.md, "Kara: our interpretation";
METHODS-2.md §1), in numpy, float64. Per (layer, KV head) and window of W compressible + P protected tokens:
scores s[j] = mean over all W + P window queries and the G query heads of the KV head of softmax over the W
compressible keys (no causal mask); K candidates = top-K of s (ties: lower index); Token2Chunk: each consecutive
candidate pair a < b with b > a + 1 is a chunk scored (s[a] + s[b]) / 2 / L**gamma (L = b - a + 1), admitted best
first (ties: lower a) while kept + (b - a - 1) <= R; then the best remaining tokens by s fill the budget R."""
import numpy as np


def scores(queries, keys):
    """queries [Q, H, d], keys [W, Hkv, d] -> [Hkv, W]."""
    num_queries, num_heads, dim = queries.shape
    num_keys, num_kv_heads, _ = keys.shape
    group = num_heads // num_kv_heads
    q = queries.astype(np.float64).reshape(num_queries, num_kv_heads, group, dim)
    logits = np.einsum("rhgd,thd->hgrt", q, keys.astype(np.float64)) / np.sqrt(dim)  # [Hkv, G, Q, W]
    logits -= logits.max(axis=-1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=-1, keepdims=True)
    return probs.mean(axis=(1, 2))


def best_first(s):
    """Positions by score descending, ties to the lower index."""
    return [int(i) for i in np.lexsort((np.arange(len(s)), -np.asarray(s)))]


def select(s, candidates, budget, gamma=1.0):
    """One KV head: (ascending kept positions, ascending admitted chunks [a, b])."""
    budget = min(budget, len(s))
    cands = sorted(best_first(s)[: min(candidates, budget)])
    kept = set(cands)
    chunks = [((s[a] + s[b]) / 2 / (b - a + 1) ** gamma, a, b) for a, b in zip(cands, cands[1:]) if b > a + 1]
    chunks.sort(key=lambda c: (-c[0], c[1]))
    admitted = []
    for _, a, b in chunks:
        if len(kept) + (b - a - 1) <= budget:
            kept.update(range(a + 1, b))
            admitted.append([a, b])
    for t in best_first(s):
        if len(kept) >= budget:
            break
        kept.add(t)
    return sorted(kept), sorted(admitted)


def trigger_steps(num_steps, window, buffer, period):
    """Decoded-token counts at which the periodic policy compresses over a synthetic decode of single tokens
    (nothing uncompressed at the start); each compression leaves the protected buffer uncompressed."""
    uncompressed, fired = 0, []
    for decoded in range(1, num_steps + 1):
        uncompressed += 1
        if decoded % period == 0 and uncompressed >= window + buffer:
            fired.append(decoded)
            uncompressed = buffer
    return fired
