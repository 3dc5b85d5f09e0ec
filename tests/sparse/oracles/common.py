"""numpy building blocks the method oracles share, written from METHODS.md's cross-cutting rules."""
import numpy as np


def softmax(x, axis=-1):
    x = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(x)
    return e / np.sum(e, axis=axis, keepdims=True)


def window_probs(q, k, scale):
    """Softmax probabilities of the last n = len(q) query positions over all T keys, causal: query r (absolute
    position T - n + r) sees keys <= its position. q [n, H, D], k [T, Hkv, D] -> [H, n, T] (fp32)."""
    n, num_heads, _ = q.shape
    t, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    kk = np.repeat(k.transpose(1, 0, 2), group, axis=0)            # [H, T, D]
    logits = np.einsum("nhd,htd->hnt", q.astype(np.float64), kk.astype(np.float64)) * scale
    mask = np.arange(t)[None, :] > (t - n + np.arange(n))[:, None]  # [n, T]
    logits = np.where(mask[None], -np.inf, logits)
    return softmax(logits, axis=-1)


def probs_by_position(q, q_positions, k, k_positions, scale, window=0):
    """Softmax probabilities by original position: query row r sees the keys at positions <= q_positions[r] and,
    on a sliding-window layer (window W), > q_positions[r] - W. q [n, H, D], k [len, Hkv, D] -> [H, n, len]."""
    group = q.shape[1] // k.shape[1]
    kk = np.repeat(k, group, axis=1).astype(np.float64)                        # [len, H, D]
    logits = np.einsum("nhd,thd->hnt", q.astype(np.float64), kk) * scale
    qp = np.asarray(q_positions)[:, None]
    kp = np.asarray(k_positions)[None, :]
    visible = (kp <= qp) & ((kp > qp - window) if window else True)
    return softmax(np.where(visible[None], logits, -np.inf), axis=-1)


def attention_by_position(q, q_positions, k, v, k_positions, scale, window=0):
    """Attention output of probs_by_position: v [len, Hkv, D] -> [n, H, D]."""
    group = q.shape[1] // k.shape[1]
    probs = probs_by_position(q, q_positions, k, k_positions, scale, window)
    return np.einsum("hnt,thd->nhd", probs, np.repeat(v, group, axis=1).astype(np.float64))


def sliding_tail(num_tokens, window, count):
    """What an eviction keeps of a sliding-window layer's stream of num_tokens tokens (sliding_window_tail.h): the
    newest min(count, window - 1, num_tokens), as stream rows, ascending. With no gaps, the last W rows attention
    reads are the last W positions."""
    n = max(0, min(count, window - 1, num_tokens))
    return list(range(num_tokens - n, num_tokens))


def pool1d(scores, kernel, kind):
    """Pooling along the last axis, stride 1, padding kernel // 2: avg counts the zero padding (count_include_pad),
    max pads with -inf."""
    pad = kernel // 2
    fill = 0.0 if kind == "avgpool" else -np.inf
    padded = np.pad(scores, [(0, 0)] * (scores.ndim - 1) + [(pad, pad)], constant_values=fill)
    windows = np.lib.stride_tricks.sliding_window_view(padded, kernel, axis=-1)
    out = windows.mean(axis=-1) if kind == "avgpool" else windows.max(axis=-1)
    return out[..., : scores.shape[-1]]


def reduce_group(scores, num_kv_heads, how="mean"):
    """[H, ...] query-head scores -> [Hkv, ...] by reducing each KV head's query group."""
    grouped = scores.reshape(num_kv_heads, scores.shape[0] // num_kv_heads, *scores.shape[1:])
    return {"mean": grouped.mean, "max": grouped.max, "sum": grouped.sum}[how](axis=1)


def attention_over(q, k, v, kept_per_kv_head, scale):
    """One query row per head against the kept tokens of its KV head: q [H, D], k/v [T, Hkv, D]."""
    num_heads = q.shape[0]
    group = num_heads // k.shape[1]
    out = np.zeros_like(q, dtype=np.float64)
    for h in range(num_heads):
        idx = np.asarray(kept_per_kv_head[h // group])
        logits = k[idx, h // group].astype(np.float64) @ q[h].astype(np.float64) * scale
        out[h] = softmax(logits) @ v[idx, h // group].astype(np.float64)
    return out


def ring_stream_pages(page_size, num_tokens, budget, one_token_step):
    """One stream's pages under an eviction that refills the evicted slot after one-token steps (evict_slots): it keeps
    min(num_tokens, budget) tokens, and after a one-token step over a budget on a page boundary also the page that step
    opened, as the spare its next token takes back (PageTable::drop_last_slot)."""
    held = min(num_tokens, budget)
    spare = one_token_step and num_tokens > budget and budget % page_size == 0
    return -(-held // page_size) + (1 if spare else 0)
