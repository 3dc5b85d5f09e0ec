"""R-KV oracle, written from the reference code (Zefan-Cai/R-KV rkv/compression/r1_kv.py R1KV._compute_scores and
update_kv, rkv/utils.py compute_attention_scores and cal_similarity; METHODS-2.md §3) in numpy, float64:
GQA max over the query group of the raw logits; softmax over the keys older than the window; mean over the window
rows; max-pool (kernel, stride 1, -inf padding); redundancy = softmax of the column means of the key cosine
similarities with the diagonal and each row's newest near-duplicate (> threshold; column 0 when none) zeroed;
score = lambda * importance - (1 - lambda) * redundancy; top (budget - window) plus the window. Ties go to the
lower index (torch.topk leaves them unspecified)."""
import numpy as np


def importance(queries, keys, window, kernel):
    """queries [w, H, d], keys [T, Hkv, d] -> [Hkv, T - w] max-pooled window attention."""
    w, num_heads, dim = queries.shape
    num_tokens, num_kv_heads, _ = keys.shape
    group = num_heads // num_kv_heads
    q = queries.astype(np.float64).reshape(w, num_kv_heads, group, dim)
    k = keys.astype(np.float64)
    logits = np.einsum("rhgd,thd->hgrt", q, k) / np.sqrt(dim)      # [Hkv, G, w, T]
    logits = logits.max(axis=1)[:, :, : num_tokens - window]         # [Hkv, w, T - w]
    logits -= logits.max(axis=-1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=-1, keepdims=True)
    mean = probs.mean(axis=1)                                        # [Hkv, T - w]
    pad = kernel // 2
    padded = np.pad(mean, ((0, 0), (pad, pad)), constant_values=-np.inf)
    return np.stack([padded[:, j: j + mean.shape[1]] for j in range(kernel)]).max(axis=0)


def redundancy(keys_head, threshold=0.5):
    """keys_head [T, d] -> [T]: cal_similarity with retain_direction "last"."""
    k = keys_head.astype(np.float64)
    unit = k / (np.linalg.norm(k, axis=-1, keepdims=True) + 1e-8)
    sim = unit @ unit.T
    np.fill_diagonal(sim, 0.0)
    num_tokens = sim.shape[0]
    cols = np.where(sim > threshold, np.arange(num_tokens)[None, :], 0)
    sim[np.arange(num_tokens), cols.max(axis=-1)] = 0.0
    mean = sim.mean(axis=0)
    e = np.exp(mean - mean.max())
    return e / e.sum()


def scores(queries, keys, window=8, kernel=7, mix_lambda=0.07, threshold=0.5):
    """[Hkv, T - w] final R-KV scores."""
    imp = importance(queries, keys, window, kernel)
    red = np.stack([redundancy(keys[:, h], threshold)[: keys.shape[0] - window] for h in range(keys.shape[1])])
    return mix_lambda * imp - (1 - mix_lambda) * red


def kept(queries, keys, budget, window=8, kernel=7, mix_lambda=0.07):
    """[Hkv] ascending kept positions (all of them when T <= budget)."""
    num_tokens, num_kv_heads, _ = keys.shape
    if num_tokens <= budget:
        return [list(range(num_tokens))] * num_kv_heads
    s = scores(queries, keys, window, kernel, mix_lambda)
    out = []
    for h in range(num_kv_heads):
        order = np.lexsort((np.arange(s.shape[1]), -s[h]))  # score descending, then lower index
        out.append(sorted(int(i) for i in order[: budget - window]) + list(range(num_tokens - window, num_tokens)))
    return out


def trigger_steps(prompt_len, num_steps, budget, buffer):
    """Decode steps (1-based count of decoded tokens) at which R1KV.should_compact fires, and the resident length
    after each step, for a synthetic decode of num_steps single tokens."""
    resident, fired = prompt_len, []
    for decoded in range(1, num_steps + 1):
        resident += 1
        if resident >= budget + buffer and decoded // buffer > (decoded - 1) // buffer:
            fired.append(decoded)
            resident = budget
    return fired
