"""ShadowKV oracle, in numpy float64, following the reference's ShadowKVCache (models/kv_cache.py: get_svd,
prefill_kv_cache, get_retrieval_position_ids, get_key_cache) for one layer and batch 1. What we do differently
from the reference is listed in docs/fidelity.md, "ShadowKV"."""
import numpy as np


def rope(x, positions, theta):
    """rotate_half RoPE (the reference's apply_rotary_pos_emb) on x [T, heads, d] at positions [T]; the angles
    position * inv_freq in fp32, as the reference's (and HF's) cos/sin cache computes them."""
    dim = x.shape[-1]
    inv_freq = (1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)).astype(np.float32)
    angles = (np.asarray(positions, dtype=np.float32)[:, None] * inv_freq[None, :]).astype(np.float64)
    cos = np.cos(np.concatenate([angles, angles], -1))[:, None, :]
    sin = np.sin(np.concatenate([angles, angles], -1))[:, None, :]
    return x * cos + np.concatenate([-x[..., dim // 2:], x[..., :dim // 2]], -1) * sin


def low_rank(pre_rope_keys, rank):
    """get_svd: the heads side by side, [n, Hkv * d] = U S V^T; U [n, r] and SV [Hkv, r, d]."""
    n, kv_heads, dim = pre_rope_keys.shape
    u, s, vt = np.linalg.svd(pre_rope_keys.reshape(n, kv_heads * dim).astype(np.float64), full_matrices=False)
    rank = min(rank, len(s))
    sv = (s[:rank, None] * vt[:rank]).reshape(rank, kv_heads, dim).transpose(1, 0, 2)
    return u[:, :rank], sv


def sketch(post_rope_keys, chunk_size, local_chunks, outlier_chunks):
    """prefill_kv_cache: per KV head, (outlier chunks ascending, landmark chunk ids, landmarks [m, d]) and the
    number of sketched chunks."""
    n, kv_heads, dim = post_rope_keys.shape
    chunks = n // chunk_size - local_chunks
    ctx = post_rope_keys[:chunks * chunk_size].astype(np.float64).reshape(chunks, chunk_size, kv_heads, dim)
    ctx = ctx.transpose(2, 0, 1, 3)  # [Hkv, chunks, chunk_size, d]
    means = ctx.mean(axis=2)
    eps = 1e-8
    cos = np.einsum("hcd,hcjd->hcj", means, ctx) / (
        np.maximum(np.linalg.norm(means, axis=-1), eps)[..., None] * np.maximum(np.linalg.norm(ctx, axis=-1), eps))
    least = cos.min(axis=-1)  # [Hkv, chunks]
    heads = []
    for h in range(kv_heads):
        order = np.lexsort((np.arange(chunks), least[h]))  # topk(largest=False), ties to the lower chunk
        outliers = sorted(int(c) for c in order[:outlier_chunks])
        rest = [c for c in range(chunks) if c not in set(outliers)]
        heads.append((outliers, rest, means[h, rest]))
    return heads, chunks


def chunk_scores(queries, landmarks):
    """get_retrieval_position_ids: queries [Q, H, d], landmarks per KV head [m, d] -> per KV head [m]: softmax over
    the landmarks per query head (logits over sqrt(128), the reference's constant), summed over the rows, max over
    the group."""
    num_queries, num_heads, dim = queries.shape
    group = num_heads // len(landmarks)
    out = []
    for h, marks in enumerate(landmarks):
        q = queries[:, h * group:(h + 1) * group].astype(np.float64)  # [Q, G, d]
        logits = np.einsum("rgd,md->grm", q, marks) / np.sqrt(128.0)
        logits -= logits.max(axis=-1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=-1, keepdims=True)
        out.append(probs.sum(axis=1).max(axis=0))
    return out


def choose(scores, landmark_chunks, budget, chunk_size):
    """The best budget / chunk_size landmarks (ties to the lower), as ascending chunk ids."""
    order = np.lexsort((np.arange(len(scores)), -np.asarray(scores)))[:budget // chunk_size]
    return sorted(landmark_chunks[int(j)] for j in order)


def rebuild(u, sv, kv_head, chunks, chunk_size, theta):
    """get_key_cache: U[t] SV[h] for the chunks' tokens, rotated at t. [len(chunks) * chunk_size, d]."""
    positions = np.array([c * chunk_size + j for c in chunks for j in range(chunk_size)], dtype=np.int64)
    keys = u[positions] @ sv[kv_head]
    return rope(keys[:, None, :], positions, theta)[:, 0, :]
