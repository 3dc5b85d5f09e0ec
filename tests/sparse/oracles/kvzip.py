"""KVzip oracle, written from METHODS.md ("KVzip"): after the prompt, the model re-reads the context chunk by chunk
("repeat the previous context"); within each reconstruction pass, a context token's score is the largest softmax
probability any repeat query of its KV head's group gives it, where the softmax only sees the sink keys, the
chunk's keys and the repeat's own keys (causal). One global threshold over every (layer, KV head, token) then
keeps the pairs scoring strictly above the max(int(N * ratio) - 1, 0)-th largest score; `pair-uniform` keeps
the top int(C * ratio) of each (layer, KV head). The first n_sink tokens stand for the system prompt (never
evicted), as the engine documents. Sliding-window layers (window W) are not rated: each of their (layer, KV head)
keeps the last min(int(C * ratio), W - 1) context tokens and only the sinks the next query can see (position
>= P - W + 1), and the threshold runs over the other layers' pairs."""
import numpy as np

from oracles.common import sliding_tail, softmax

FIRST_INSTRUCTION = "\n\nRepeat the previous context exactly."
NEXT_INSTRUCTION = "\n\nRepeat the part of the previous context exactly, starting with "
NUM_CARRIED = 8


def chunk_ranges(num_prompt, num_sink, chunk_size):
    """[(begin, end)] token ranges of the context [num_sink, num_prompt) in chunks of chunk_size."""
    return [(b, min(b + chunk_size, num_prompt)) for b in range(num_sink, num_prompt, chunk_size)]


def repeat_inputs(token_ids, num_prompt, num_sink, chunk_size, encode=None, chat_suffix="\n"):
    """The token ids of every reconstruction pass. Without a tokenizer (encode None) the instruction and the
    suffix are empty."""
    def enc(text):
        return list(encode[text]) if encode is not None else []
    inputs = []
    for i, (b, e) in enumerate(chunk_ranges(num_prompt, num_sink, chunk_size)):
        carried = list(token_ids[b - min(NUM_CARRIED, chunk_size):b])
        head = enc(FIRST_INSTRUCTION) if i == 0 else enc(NEXT_INSTRUCTION) + carried
        inputs.append(head + enc(chat_suffix) + list(token_ids[b:e]))
    return inputs


def chunk_scores(q_repeat, k_stored, k_repeat, num_sink, begin, end, scale):
    """Scores of the chunk [begin, end) from one pass at one layer: q_repeat [n, H, D], k_stored [T, Hkv, D] (the
    cache before the pass), k_repeat [n, Hkv, D] -> [Hkv, end - begin] (float64)."""
    n, num_heads, _ = q_repeat.shape
    num_kv_heads = k_stored.shape[1]
    group = num_heads // num_kv_heads
    width = end - begin
    out = np.zeros((num_kv_heads, width))
    visible = np.ones((n, num_sink + width + n), dtype=bool)
    visible[:, num_sink + width:] = np.arange(n)[None, :] <= np.arange(n)[:, None]  # causal among repeat rows
    for kvh in range(num_kv_heads):
        keys = np.concatenate([k_stored[:num_sink, kvh], k_stored[begin:end, kvh], k_repeat[:, kvh]]).astype(np.float64)
        queries = q_repeat[:, kvh * group:(kvh + 1) * group].astype(np.float64)   # [n, G, D]
        logits = np.einsum("ngd,md->gnm", queries, keys) * scale                 # [G, n, keys]
        probs = softmax(np.where(visible[None], logits, -np.inf), axis=-1)
        out[kvh] = probs[:, :, num_sink:num_sink + width].max(axis=(0, 1))
    return out


def windows_of(case):
    return case.sliding_windows or [0] * case.num_layers


def scores(case, step, num_sink, chunk_size):
    """[L, Hkv, C] scores of the compression in `step` (the step completing the prompt), from the case's pass
    q/k; 0 on sliding-window layers."""
    num_prompt = case.prefill_len
    ranges = chunk_ranges(num_prompt, num_sink, chunk_size)
    out = np.zeros((case.num_layers, case.num_kv_heads, num_prompt - num_sink))
    scale = 1 / np.sqrt(case.head_dim)
    for layer in range(case.num_layers):
        if windows_of(case)[layer]:
            continue
        k_stored = case.all_keys(layer)[:num_prompt]
        for p, (b, e) in enumerate(ranges):
            out[layer, :, b - num_sink:e - num_sink] = chunk_scores(
                case.pass_q[step][p][layer], k_stored, case.pass_k[step][p][layer], num_sink, b, e, scale)
    return out


def kept_sinks(num_prompt, num_sink, window):
    """The sink positions a layer keeps (all of them on a full-attention layer)."""
    return list(range(max(0, num_prompt - window + 1) if window else 0, num_sink))


def select(score, ratio, level="pair", windows=None):
    """Kept context indices per (layer, KV head) from [L, Hkv, C] scores and the layers' sliding windows, and
    the threshold (None for pair-uniform or when no layer is rated)."""
    num_layers, num_kv_heads, num_context = score.shape
    windows = windows or [0] * num_layers
    per_stream = int(num_context * ratio)
    rated = [l for l in range(num_layers) if not windows[l]]
    kept = [None] * num_layers
    for l in range(num_layers):
        if windows[l]:
            kept[l] = [sliding_tail(num_context, windows[l], per_stream) for _ in range(num_kv_heads)]
    if level == "pair-uniform":
        for l in rated:
            kept[l] = [sorted(np.lexsort((np.arange(num_context), -score[l, h]))[:per_stream].tolist())
                       for h in range(num_kv_heads)]
        return kept, None
    if not rated:
        return kept, None
    flat = np.sort(score[rated].reshape(-1))[::-1]
    threshold = flat[max(int(flat.size * ratio) - 1, 0)]
    for l in rated:
        kept[l] = [np.nonzero(score[l, h] > threshold)[0].tolist() for h in range(num_kv_heads)]
    return kept, threshold


def most_pages(num_streams, base, cap, total, page_size):
    """Brute force of the memory bound: the most pages num_streams streams of base + x_s tokens (x_s <= cap,
    sum x_s <= total) can hold, by dynamic programming over streams."""
    best = {0: 0}  # tokens used -> most pages
    for _ in range(num_streams):
        nxt = {}
        for used, pages in best.items():
            for x in range(0, min(cap, total - used) + 1):
                p = pages + -(-(base + x) // page_size)
                if nxt.get(used + x, -1) < p:
                    nxt[used + x] = p
        best = nxt
    return max(best.values())
