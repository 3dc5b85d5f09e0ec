"""DeepSeek-V2 (multi-head latent attention, shared experts, dense first layers) on the CPU reference path against a
numpy oracle of the checkpoints' own modeling_deepseek.py (float64; the CPU torch wheel is not installable here,
so the oracle follows its DeepseekV2Attention, MoEGate, DeepseekV2MoE and yarn rotary embedding line by line):
random small checkpoints written as HF directories give the oracle's logits within fp32 tolerance at every
position, prefill and decode, and route every token of every MoE layer to the oracle's experts. The cases cover
q_lora_rank null (V2-Lite) and set, yarn scaling with both mscales (cos/sin and softmax scale), the routed scaling
factor, renormalized top-k, moe_layer_freq and several shared experts, each of which changes the result."""
import json
import re
import subprocess

import numpy as np
import pytest

from conftest import BUILD_DIR
from numpy_reference import RandomCheckpoint, rms_norm, silu, write_hf_dir

TOOL = BUILD_DIR / "tests" / "model" / "moe_parity_tool"
ENGINE_TOOL = BUILD_DIR / "tests" / "model" / "engine_greedy_tool"
ENGINE_KV_BYTES = 64 << 20  # engine_greedy_tool's KV pool
PAGE_SIZE = 4
BASE = {"model_type": "deepseek_v2", "architectures": ["DeepseekV2ForCausalLM"], "vocab_size": 64,
        "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 16, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 32, "q_lora_rank": None,
        "qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 32, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "norm_topk_prob": False, "routed_scaling_factor": 1.0, "topk_method": "greedy", "scoring_func": "softmax",
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None, "max_position_embeddings": 256,
        "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False, "bos_token_id": 1,
        "eos_token_id": 2}
PROMPT = [1, 17, 5, 33, 60, 8, 41, 2, 29, 12, 50, 3, 19, 44]


def is_moe(config, layer):
    return layer >= config["first_k_dense_replace"] and layer % config["moe_layer_freq"] == 0


def random_weights(config, seed):
    """HF-named float32 weights, experts one tensor each, as DeepSeek-V2-Lite's checkpoint stores them."""
    checkpoint = RandomCheckpoint(config, seed)
    linear, norm, w = checkpoint.linear, checkpoint.norm, checkpoint.weights
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    nope, rope, v_dim, rank = (config[k] for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                                                   "kv_lora_rank"))
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        checkpoint.layer_norms(p, hidden)
        if config["q_lora_rank"] is None:
            w[p + "self_attn.q_proj.weight"] = linear(heads * (nope + rope), hidden)
        else:
            w[p + "self_attn.q_a_proj.weight"] = linear(config["q_lora_rank"], hidden)
            w[p + "self_attn.q_a_layernorm.weight"] = norm(config["q_lora_rank"])
            w[p + "self_attn.q_b_proj.weight"] = linear(heads * (nope + rope), config["q_lora_rank"])
        # Sharper attention than 1/sqrt(in) gives, so that the rope dimensions matter.
        w[p + "self_attn.kv_a_proj_with_mqa.weight"] = linear(rank + rope, hidden, gain=2.0)
        w[p + "self_attn.kv_a_layernorm.weight"] = norm(rank)
        w[p + "self_attn.kv_b_proj.weight"] = linear(heads * (nope + v_dim), rank)
        w[p + "self_attn.o_proj.weight"] = linear(hidden, heads * v_dim)
        if is_moe(config, i):
            # A router scaled up so that each token's choice stands clear of the next expert.
            w[p + "mlp.gate.weight"] = linear(config["n_routed_experts"], hidden, gain=4.0)
            inter = config["moe_intermediate_size"]
            for e in range(config["n_routed_experts"]):
                checkpoint.gated_mlp(p + f"mlp.experts.{e}.", inter, hidden)
            if config["n_shared_experts"]:
                checkpoint.gated_mlp(p + "mlp.shared_experts.", inter * config["n_shared_experts"], hidden)
        else:
            checkpoint.gated_mlp(p + "mlp.", config["intermediate_size"], hidden)
    return w


def yarn_get_mscale(scale, mscale):
    return 1.0 if scale <= 1 else 0.1 * mscale * np.log(scale) + 1.0


def rotary(config):
    """(inv_freq [rope / 2], cos/sin scale) of DeepseekV2RotaryEmbedding or DeepseekV2YarnRotaryEmbedding."""
    dim, base, scaling = config["qk_rope_head_dim"], config["rope_theta"], config["rope_scaling"]
    freq_extra = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    if scaling is None:
        return freq_extra, 1.0
    factor, original = scaling["factor"], scaling["original_max_position_embeddings"]

    def correction_dim(rotations):
        return dim * np.log(original / (rotations * 2 * np.pi)) / (2 * np.log(base))

    low = max(np.floor(correction_dim(scaling["beta_fast"])), 0)
    high = min(np.ceil(correction_dim(scaling["beta_slow"])), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    mask = 1.0 - ramp
    inv_freq = freq_extra / factor * (1 - mask) + freq_extra * mask
    return inv_freq, yarn_get_mscale(factor, scaling["mscale"]) / yarn_get_mscale(factor, scaling["mscale_all_dim"])


def apply_rope(x, positions, inv_freq, mscale):
    """modeling_deepseek.py's apply_rotary_pos_emb on x [T, heads, rope]: its interleaved pairs permuted to halves,
    then rotate_half RoPE with cos and sin scaled by the yarn mscale."""
    x = np.concatenate([x[..., 0::2], x[..., 1::2]], -1)
    angles = positions[:, None] * inv_freq[None, :]
    cos = (np.cos(np.concatenate([angles, angles], -1)) * mscale)[:, None, :]
    sin = (np.sin(np.concatenate([angles, angles], -1)) * mscale)[:, None, :]
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def softmax_scale(config):
    scale = (config["qk_nope_head_dim"] + config["qk_rope_head_dim"]) ** -0.5
    scaling = config["rope_scaling"]
    if scaling is not None and scaling.get("mscale_all_dim", 0):
        scale *= yarn_get_mscale(scaling["factor"], scaling["mscale_all_dim"]) ** 2
    return scale


def mlp(x, w, prefix):
    return (silu(x @ w[prefix + "gate_proj.weight"].T) * (x @ w[prefix + "up_proj.weight"].T)) @ w[prefix + "down_proj.weight"].T


def oracle(config, weights, tokens, mask=None, select=None):
    """Logits [T, vocab] and, per MoE layer, each position's experts (descending probability) and the smallest gap
    between a token's last chosen and first unchosen expert probability. `mask` [T, T]: the keys each query sees
    (default: causal). `select(layer, q_latent, latent)`, when given, returns each layer's mask from what a sparse
    method over the shared latent sees: the queries with W_uk absorbed [T, heads, rank + rope] and the latent rows
    [c ; k_rope] [T, rank + rope], whose products are the layer's logits before the softmax scale."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    eps, heads = config["rms_norm_eps"], config["num_attention_heads"]
    nope, rope, v_dim, rank = (config[k] for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                                                   "kv_lora_rank"))
    t = len(tokens)
    positions = np.arange(t, dtype=np.float64)
    inv_freq, mscale = rotary(config)
    h = w["model.embed_tokens.weight"][tokens]
    experts, min_gap = {}, np.inf
    mask = np.tril(np.ones((t, t), dtype=bool)) if mask is None else mask
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        if config["q_lora_rank"] is None:
            q = x @ w[p + "self_attn.q_proj.weight"].T
        else:
            q_a = rms_norm(x @ w[p + "self_attn.q_a_proj.weight"].T, w[p + "self_attn.q_a_layernorm.weight"], eps)
            q = q_a @ w[p + "self_attn.q_b_proj.weight"].T
        q = q.reshape(t, heads, nope + rope)
        q_nope, q_pe = q[..., :nope], q[..., nope:]
        kv_a = x @ w[p + "self_attn.kv_a_proj_with_mqa.weight"].T
        c_kv, k_pe = kv_a[:, :rank], kv_a[:, rank:].reshape(t, 1, rope)
        c_kv = rms_norm(c_kv, w[p + "self_attn.kv_a_layernorm.weight"], eps)
        kv_b = w[p + "self_attn.kv_b_proj.weight"].reshape(heads, nope + v_dim, rank)
        kv = np.einsum("tr,hdr->thd", c_kv, kv_b)
        k_nope, v = kv[..., :nope], kv[..., nope:]
        q_pe, k_pe = apply_rope(q_pe, positions, inv_freq, mscale), apply_rope(k_pe, positions, inv_freq, mscale)
        if select is not None:
            q_latent = np.concatenate([np.einsum("thn,hnr->thr", q_nope, kv_b[:, :nope]), q_pe], -1)
            mask = select(i, q_latent, np.concatenate([c_kv, k_pe[:, 0]], -1))
        query = np.concatenate([q_nope, q_pe], -1)
        key = np.concatenate([k_nope, np.broadcast_to(k_pe, (t, heads, rope))], -1)
        out = np.zeros((t, heads, v_dim))
        for head in range(heads):
            scores = query[:, head] @ key[:, head].T * softmax_scale(config)
            scores = np.where(mask, scores, -np.inf)
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            out[:, head] = (probs / probs.sum(-1, keepdims=True)) @ v[:, head]
        h = h + out.reshape(t, heads * v_dim) @ w[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        if not is_moe(config, i):
            h = h + mlp(x, w, p + "mlp.")
            continue
        logits = x @ w[p + "mlp.gate.weight"].T
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        top = config["num_experts_per_tok"]
        order = np.argsort(-probs, axis=-1, kind="stable")
        chosen = order[:, :top]
        gates = np.take_along_axis(probs, chosen, -1)
        sorted_probs = np.take_along_axis(probs, order, -1)
        min_gap = min(min_gap, float(np.min(sorted_probs[:, top - 1] - sorted_probs[:, top])))
        if top > 1 and config["norm_topk_prob"]:
            gates = gates / (gates.sum(-1, keepdims=True) + 1e-20)
        else:
            gates = gates * config["routed_scaling_factor"]
        moe = np.zeros_like(h)
        for row in range(t):
            for e, g in zip(chosen[row], gates[row]):
                moe[row] += g * mlp(x[row], w, f"{p}mlp.experts.{e}.")
        if config["n_shared_experts"]:
            moe = moe + mlp(x, w, p + "mlp.shared_experts.")
        h = h + moe
        experts[str(i)] = chosen.tolist()
    logits = rms_norm(h, w["model.norm.weight"], eps) @ w["lm_head.weight"].T
    return logits, experts, min_gap


def run_tool(model, load_format, tmp_path):
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(PROMPT))
    logits_file = tmp_path / "logits.f32"
    return subprocess.run([str(TOOL), str(model), load_format, str(tokens), str(logits_file)], capture_output=True,
                          text=True), logits_file


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1,
        "mscale": 1.0, "mscale_all_dim": 0.8}
# V2-Lite's shape (q_lora_rank null, one shared expert, plain top-k); a query latent with yarn, two shared experts
# and a routed scaling factor; renormalized top-3 in every second layer. Each with a weight seed whose routing has
# no near-tie.
CASES = {"lite": ({}, 1),
         "q_lora_yarn": ({"q_lora_rank": 24, "rope_scaling": YARN, "n_shared_experts": 2,
                          "routed_scaling_factor": 2.5}, 6),
         "norm_freq2": ({"num_hidden_layers": 4, "moe_layer_freq": 2, "num_experts_per_tok": 3,
                         "norm_topk_prob": True, "routed_scaling_factor": 16.0}, 13)}


@pytest.mark.parametrize("case", CASES)
def test_hf_checkpoint_matches_oracle(case, tmp_path):
    config = {**BASE, **CASES[case][0]}
    weights = random_weights(config, seed=CASES[case][1])
    out, logits_file = run_tool(write_hf_dir(tmp_path / "hf", config, weights), "hf", tmp_path)
    assert out.returncode == 0, out.stderr
    logits = np.fromfile(logits_file, dtype=np.float32).reshape(-1, config["vocab_size"])
    experts = json.loads(out.stdout)["experts"]
    assert sorted(experts) == [str(i) for i in range(config["num_hidden_layers"]) if is_moe(config, i)]
    expected, expected_experts, min_gap = oracle(config, weights, PROMPT)
    # fp32 router probabilities are good to ~1e-6; a smaller gap could flip a choice without any bug.
    assert min_gap > 1e-4, f"the test data has a near-tie in routing (gap {min_gap:.1e}): pick another seed"
    err = np.max(np.abs(logits - expected)) / np.max(np.abs(expected))
    assert err < 2e-5, f"max relative logit error {err:.2e}"
    assert experts == expected_experts


def oracle_greedy(config, weights, prompt, n, mask_of=None, select=None):
    """The oracle's n greedy tokens after `prompt`, the smallest top-1 / top-2 logit gap on the way and the smallest
    routing gap (oracle()'s) over every token but the last. `mask_of(t)`: the attention mask of t tokens; `select`:
    oracle()'s."""
    tokens, logit_gap, routing_gap = list(prompt), np.inf, np.inf
    for _ in range(n):
        all_logits, _, gap = oracle(config, weights, tokens, mask_of(len(tokens)) if mask_of else None, select)
        top2 = np.sort(all_logits[-1])[-2:]
        logit_gap, routing_gap = min(logit_gap, float(top2[1] - top2[0])), min(routing_gap, gap)
        tokens.append(int(np.argmax(all_logits[-1])))
    return tokens[len(prompt):], logit_gap, routing_gap


def engine_greedy(model, tmp_path, max_tokens, max_batched_tokens, *method):
    """The engine's greedy tokens, and the tokens its KV pool holds per layer and KV head."""
    tokens = tmp_path / "prompt.json"
    tokens.write_text(json.dumps(PROMPT))
    out = subprocess.run([str(ENGINE_TOOL), str(model), "hf", str(tokens), str(max_tokens), str(max_batched_tokens),
                          str(PAGE_SIZE), *method], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    # The engine logs to stdout before the tool prints its result.
    capacity = int(re.search(r"(\d+) tokens per layer and KV head", out.stdout).group(1))
    return json.loads(out.stdout.splitlines()[-1])["tokens"], capacity


@pytest.mark.parametrize("case", ["lite", "q_lora_yarn"])
def test_engine_greedy_matches_oracle(case, tmp_path):
    """The serving engine (scheduler, paged shared-latent store, absorbed attention) generates the oracle's greedy
    tokens, with the prompt prefilled in one step and in chunks of 5 tokens; its pool is sized by the latent's
    bytes: one row of kv_lora_rank + qk_rope per token and layer, for all heads."""
    config = {**BASE, **CASES[case][0]}
    weights = random_weights(config, seed=CASES[case][1])
    model = write_hf_dir(tmp_path / "hf", config, weights)
    expected, logit_gap, routing_gap = oracle_greedy(config, weights, PROMPT, 10)
    assert logit_gap > 1e-3 and routing_gap > 1e-4, f"the test data has a near-tie ({logit_gap:.1e}, {routing_gap:.1e})"
    latent_page = PAGE_SIZE * (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * 4
    layers = config["num_hidden_layers"]
    for max_batched_tokens in (64, 5):
        tokens, capacity = engine_greedy(model, tmp_path, 10, max_batched_tokens)
        assert tokens == expected
        assert capacity == ENGINE_KV_BYTES // latent_page // layers * PAGE_SIZE


@pytest.mark.parametrize("method, sparse_config", [("streamingllm", {"budget": 64, "sink_tokens": 4}),
                                                   ("snapkv", {"budget": 64, "window": 4}),
                                                   ("quest", {"token_budget": 64, "dense_layers": 0})])
def test_sparse_methods_run_over_latent_attention(method, sparse_config, tmp_path):
    """Eviction and selection methods run over the shared latent store; with a budget above the sequence they keep
    every token, so the oracle's greedy tokens come out."""
    config = {**BASE, **CASES["lite"][0]}
    weights = random_weights(config, seed=CASES["lite"][1])
    model = write_hf_dir(tmp_path / "hf", config, weights)
    expected = oracle_greedy(config, weights, PROMPT, 10)[0]
    assert engine_greedy(model, tmp_path, 10, 5, method, json.dumps(sparse_config))[0] == expected


def streaming_mask(t, prompt_len, budget, sinks):
    """The keys StreamingLLM leaves each query of t tokens, the prompt prefilled in one step and evicted after every
    step: causal over the prompt; a decode token at position q sees the sinks, the budget - sinks positions before
    it, and itself."""
    mask = np.tril(np.ones((t, t), dtype=bool))
    for q in range(prompt_len, t):
        mask[q, sinks:max(sinks, q - (budget - sinks))] = False
    return mask


def test_streamingllm_evicts_over_the_shared_latent_store(tmp_path):
    """StreamingLLM chooses by position alone, so it keeps the shared latent (one row per token for all heads) and
    evicts latent rows: its greedy tokens are the oracle's under its attention mask, and its pool is the latent's."""
    config = {**BASE, **CASES["lite"][0]}
    weights = random_weights(config, seed=CASES["lite"][1])
    model = write_hf_dir(tmp_path / "hf", config, weights)
    budget, sinks = 8, 2
    mask_of = lambda t: streaming_mask(t, len(PROMPT), budget, sinks)
    expected, logit_gap, _ = oracle_greedy(config, weights, PROMPT, 10, mask_of)
    assert logit_gap > 1e-3, f"the test data has a near-tie ({logit_gap:.1e})"
    assert expected != oracle_greedy(config, weights, PROMPT, 10)[0], "eviction must change the test's tokens"
    tokens, capacity = engine_greedy(model, tmp_path, 10, 64, "streamingllm",
                                     json.dumps({"budget": budget, "sink_tokens": sinks}))
    assert tokens == expected
    latent_page = PAGE_SIZE * (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * 4
    assert capacity == ENGINE_KV_BYTES // latent_page // config["num_hidden_layers"] * PAGE_SIZE


def window_select(prompt_len, window, kernel, scale, gaps, kept_prefix):
    """oracle()'s `select` for the observation-window family over the shared latent, the prompt prefilled in one
    step: each layer scores the prompt's prefix tokens by the last `window` prompt queries' softmax, summed, /
    window, average-pooled with zero padding and averaged over every head (the one latent head's query group);
    `kept_prefix(layer, scores)` gives the prefix tokens the layer keeps and the gap between the last kept and
    first dropped score (None when nothing is ranked), which is appended to gaps. Decode queries see those, the
    window and the decode tokens."""
    def select(layer, q_latent, latent):
        t, prefix = len(latent), prompt_len - window
        mask = np.tril(np.ones((t, t), dtype=bool))
        logits = np.einsum("qhr,kr->hqk", q_latent[prefix:prompt_len], latent[:prompt_len]) * scale
        logits = np.where(mask[None, prefix:prompt_len, :prompt_len], logits, -np.inf)
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs = (probs / probs.sum(-1, keepdims=True)).sum(1) / window  # [heads, prompt_len]
        padded = np.pad(probs[:, :prefix], ((0, 0), (kernel // 2, kernel // 2)))
        scores = np.stack([padded[:, j:j + kernel].sum(-1) / kernel for j in range(prefix)], -1).mean(0)
        kept, gap = kept_prefix(layer, scores)
        if gap is not None:
            gaps.append(gap)
        mask[prompt_len:, np.setdiff1d(np.arange(prefix), kept)] = False
        return mask
    return select


def top_tokens(scores, n):
    """The n best-scored tokens (the lower position first among equals) and the gap at the edge."""
    order = np.argsort(-scores, kind="stable")
    return order[:n], (scores[order[n - 1]] - scores[order[n]] if 0 < n < len(scores) else None)


def pyramid_prefix_counts(prompt_len, budget, window, beta, layers):
    """PyramidKV's prefix tokens per layer under kvpress's schedule (PyramidKVPress.get_layer_budget), for a
    budget whose schedule does not fall back to uniform."""
    capacity = window + budget
    low = (capacity - window) / beta
    high = (capacity - window) * 2 - low
    if high >= prompt_len - window:
        high = prompt_len - window
        low = (capacity - window) * 2 - high
    assert prompt_len >= high >= low >= window, "the test's schedule must not be the uniform fallback"
    step = (high - low) / (layers - 1)
    return [round(high - layer * step) - window for layer in range(layers)]


def chunk_kept_prefix(prompt_len, budget, window, chunk):
    """ChunkKV's choice over one KV head: prefix chunks of `chunk` tokens ranked by their tokens' mean score, as
    many as leave room for the window's chunks in budget // chunk chunks, plus the window chunks' tokens before the
    window."""
    num_chunks, first_window_chunk = -(-prompt_len // chunk), (prompt_len - window) // chunk
    num_kept = max(num_chunks - first_window_chunk, min(num_chunks, budget // chunk)) - (num_chunks -
                                                                                          first_window_chunk)

    def kept_prefix(layer, scores):
        chunk_scores = np.array([scores[i * chunk:(i + 1) * chunk].sum() / chunk for i in range(first_window_chunk)])
        chosen, gap = top_tokens(chunk_scores, num_kept)
        tokens = [j for i in chosen for j in range(i * chunk, (i + 1) * chunk)]
        return tokens + list(range(first_window_chunk * chunk, prompt_len - window)), gap
    return kept_prefix


def quest_select(prompt_len, token_budget, page_size, gaps):
    """oracle()'s `select` for Quest over the shared latent (every layer ranks): a decode query whose sequence has
    more pages than token_budget / page_size reads its last page and the budget - 1 other pages with the highest
    bound on its logits, sum_d max(q_d lo_d, q_d hi_d) over the page's latent keys' channel minima and maxima, with
    its absorbed query, averaged over the heads. Appends each ranking's gap at the budget's edge to gaps."""
    budget = token_budget // page_size

    def select(layer, q_latent, latent):
        t = len(latent)
        mask = np.tril(np.ones((t, t), dtype=bool))
        for q in range(prompt_len, t):
            pages = (q + page_size) // page_size
            if pages <= budget:
                continue
            keys = [latent[p * page_size:(p + 1) * page_size] for p in range(pages - 1)]
            scores = np.array([np.maximum(q_latent[q] * k.min(0), q_latent[q] * k.max(0)).sum(-1).mean() for k in keys])
            order = np.argsort(-scores, kind="stable")
            gaps.append(scores[order[budget - 2]] - scores[order[budget - 1]])
            for p in order[budget - 1:]:
                mask[q, p * page_size:(p + 1) * page_size] = False
        return mask
    return select


@pytest.mark.parametrize("method", ["snapkv", "adakv", "pyramidkv", "chunkkv", "quest"])
def test_scoring_methods_choose_over_the_shared_latent_store(method, tmp_path):
    """The observation-window family and Quest read keys only through logits, so they keep the shared latent and
    score it as the model attends: the window scores and Quest's page bounds over the latent rows with the absorbed
    queries. One latent head makes AdaKV's split across a layer's heads SnapKV's choice. Their greedy tokens are
    the oracle's under the masks those choices give, with the prompt prefilled in one step and in chunks of 5 tokens
    (the window is gathered across them), and their pool is the latent's."""
    config = {**BASE, **CASES["lite"][0]}
    weights = random_weights(config, seed=CASES["lite"][1])
    model = write_hf_dir(tmp_path / "hf", config, weights)
    gaps, budget, window, kernel = [], 8, 4, 5
    sparse_config = {"budget": budget, "window": window, "kernel": kernel}
    if method in ("snapkv", "adakv"):
        kept_prefix = lambda layer, scores: top_tokens(scores, budget - window)
    elif method == "pyramidkv":
        sparse_config["beta"] = 2
        counts = pyramid_prefix_counts(len(PROMPT), budget, window, 2, config["num_hidden_layers"])
        assert len(set(counts)) == len(counts), counts
        kept_prefix = lambda layer, scores: top_tokens(scores, counts[layer])
    elif method == "chunkkv":
        sparse_config["chunk_length"] = 2
        kept_prefix = chunk_kept_prefix(len(PROMPT), budget, window, 2)
    if method == "quest":
        sparse_config = {"token_budget": 8, "dense_layers": 0}
        select = quest_select(len(PROMPT), 8, PAGE_SIZE, gaps)
    else:
        select = window_select(len(PROMPT), window, kernel, softmax_scale(config), gaps, kept_prefix)
    expected, logit_gap, _ = oracle_greedy(config, weights, PROMPT, 10, select=select)
    assert logit_gap > 1e-3 and min(gaps) > 1e-5, f"the test data has a near-tie ({logit_gap:.1e}, {min(gaps):.1e})"
    assert expected != oracle_greedy(config, weights, PROMPT, 10)[0], "the method must change the test's tokens"
    latent_page = PAGE_SIZE * (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * 4
    metadata = 2 * (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * 4 if method == "quest" else 0
    for max_batched_tokens in (64, 5):
        tokens, capacity = engine_greedy(model, tmp_path, 10, max_batched_tokens, method, json.dumps(sparse_config))
        assert tokens == expected
        assert capacity == ENGINE_KV_BYTES // (latent_page + metadata) // config["num_hidden_layers"] * PAGE_SIZE


def test_dummy_weights_run(tmp_path):
    config = {**BASE, **CASES["q_lora_yarn"][0]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    out, logits_file = run_tool(tmp_path / "config.json", "dummy", tmp_path)
    assert out.returncode == 0, out.stderr
    logits = np.fromfile(logits_file, dtype=np.float32).reshape(-1, config["vocab_size"])
    assert logits.shape == (len(PROMPT), config["vocab_size"]) and np.all(np.isfinite(logits))


@pytest.mark.parametrize("change, message", [
    ({"kv_lora_rank": None}, "kv_lora_rank"),
    ({"qk_rope_head_dim": 15}, "qk_rope_head_dim"),
    ({"v_head_dim": 64}, "v_head_dim"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ({"topk_method": "group_limited_greedy"}, "topk_method"),
    ({"scoring_func": "sigmoid"}, "scoring_func"),
    ({"first_k_dense_replace": 7}, "first_k_dense_replace"),
    ({"n_shared_experts": -1}, "n_shared_experts"),
])
def test_bad_config_is_a_clear_error(change, message, tmp_path):
    config = {**BASE, **change}
    (tmp_path / "config.json").write_text(json.dumps(config))
    out, _ = run_tool(tmp_path / "config.json", "dummy", tmp_path)
    assert out.returncode == 1 and message in out.stderr, out.stderr


def test_missing_latent_weight_is_a_clear_error(tmp_path):
    weights = random_weights(BASE, seed=1)
    del weights["model.layers.1.self_attn.kv_b_proj.weight"]
    out, _ = run_tool(write_hf_dir(tmp_path / "hf", BASE, weights), "hf", tmp_path)
    assert out.returncode == 1 and "model.layers.1.self_attn.kv_b_proj.weight" in out.stderr
