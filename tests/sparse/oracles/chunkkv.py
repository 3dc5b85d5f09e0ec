"""ChunkKV oracle, written from METHODS.md ("ChunkKV", kvpress ChunkKVPress over SnapKV scores) and the engine's
budget mapping: chunks of c tokens aligned from 0 (the last may be partial); the chunks that overlap the window
[T - w, T) are always kept; every other chunk is scored by the mean over its tokens of the SnapKV prefix scores
summed over KV heads, and the best ones (ties: lower chunk) are added until max(#window chunks, budget // c)
chunks are kept. The same tokens for every KV head; nothing is evicted when T <= budget."""
import numpy as np

from oracles.snapkv import case_scores, top_k


def chunk_plan(num_tokens, budget, window, chunk_length):
    num_chunks = -(-num_tokens // chunk_length)
    first_window_chunk = (num_tokens - window) // chunk_length
    num_kept = max(num_chunks - first_window_chunk, min(num_chunks, budget // chunk_length))
    return num_chunks, first_window_chunk, num_kept


def num_kept_tokens(num_tokens, budget, window, chunk_length):
    num_chunks, _, num_kept = chunk_plan(num_tokens, budget, window, chunk_length)
    return (num_kept - 1) * chunk_length + num_tokens - (num_chunks - 1) * chunk_length


def chunkkv_kept(case, budget, window, chunk_length=20, **score_config):
    """[layer][kv_head] kept prompt positions, or None when the prompt is not compressed."""
    num_tokens = case.prefill_len
    if num_tokens <= budget:
        return None
    num_chunks, first_window_chunk, num_kept = chunk_plan(num_tokens, budget, window, chunk_length)
    kept = []
    for layer in range(case.num_layers):
        summed = case_scores(case, layer, window, **score_config).sum(axis=0)     # [T - w]
        chunk_scores = summed[: first_window_chunk * chunk_length].reshape(first_window_chunk, chunk_length)
        chosen = top_k(chunk_scores.mean(axis=1), num_kept - (num_chunks - first_window_chunk))
        positions = [j for c in chosen for j in range(c * chunk_length, (c + 1) * chunk_length)]
        positions += list(range(first_window_chunk * chunk_length, num_tokens))
        kept.append([positions] * case.num_kv_heads)
    return kept
