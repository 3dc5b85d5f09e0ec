"""Qwen3-MoE on the CPU reference path against a numpy oracle of transformers' Qwen3MoeForCausalLM (float64; the
CPU torch wheel is not installable here, so the oracle follows modeling_qwen3_moe.py line by line): a random
small checkpoint written as an HF directory (one tensor per expert) and as a GGUF file (stacked *_exps tensors)
gives the oracle's logits within fp32 tolerance at every position, prefill and decode, and routes every token
of every MoE layer to the oracle's experts. decoder_sparse_step, mlp_only_layers and norm_topk_prob each change
the result, so the oracle would catch one ignored."""
import json
import subprocess

import numpy as np
import pytest
from gguf import GGUFWriter

from conftest import BUILD_DIR
from numpy_reference import RandomCheckpoint, rms_norm, silu, write_hf_dir

TOOL = BUILD_DIR / "tests" / "model" / "moe_parity_tool"
BASE = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 48, "moe_intermediate_size": 16, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 3,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 256, "tie_word_embeddings": False,
        "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}
PROMPT = [1, 17, 5, 33, 60, 8, 41, 2, 29, 12, 50, 3, 19, 44]


def is_moe(config, layer):
    return layer not in config["mlp_only_layers"] and (layer + 1) % config["decoder_sparse_step"] == 0


def random_weights(config, seed):
    """HF-named float32 weights; experts stored one tensor per expert, as Qwen3-30B-A3B's checkpoint does."""
    checkpoint = RandomCheckpoint(config, seed)
    linear, norm, w = checkpoint.linear, checkpoint.norm, checkpoint.weights
    hidden, heads, kv_heads, dim = (config[k] for k in ("hidden_size", "num_attention_heads",
                                                        "num_key_value_heads", "head_dim"))
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        checkpoint.layer_norms(p, hidden)
        w[p + "self_attn.q_proj.weight"] = linear(heads * dim, hidden)
        w[p + "self_attn.k_proj.weight"] = linear(kv_heads * dim, hidden)
        w[p + "self_attn.v_proj.weight"] = linear(kv_heads * dim, hidden)
        w[p + "self_attn.o_proj.weight"] = linear(hidden, heads * dim)
        w[p + "self_attn.q_norm.weight"] = norm(dim)
        w[p + "self_attn.k_norm.weight"] = norm(dim)
        if is_moe(config, i):
            # A router scaled up so that each token's choice stands clear of the next expert.
            w[p + "mlp.gate.weight"] = linear(config["num_experts"], hidden, gain=4.0)
            for e in range(config["num_experts"]):
                checkpoint.gated_mlp(p + f"mlp.experts.{e}.", config["moe_intermediate_size"], hidden)
        else:
            checkpoint.gated_mlp(p + "mlp.", config["intermediate_size"], hidden)
    return w


def rope(x, positions, theta):
    """transformers' rotate_half RoPE on x [T, heads, dim]."""
    dim = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    angles = positions[:, None] * inv_freq[None, :]
    cos = np.cos(np.concatenate([angles, angles], -1))[:, None, :]
    sin = np.sin(np.concatenate([angles, angles], -1))[:, None, :]
    rotated = np.concatenate([-x[..., dim // 2:], x[..., :dim // 2]], -1)
    return x * cos + rotated * sin


def oracle(config, weights, tokens):
    """Logits [T, vocab] and, per MoE layer, each position's experts (descending probability) and the smallest
    gap between a token's last chosen and first unchosen expert probability."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    eps, heads, kv_heads, dim = (config[k] for k in ("rms_norm_eps", "num_attention_heads",
                                                     "num_key_value_heads", "head_dim"))
    t = len(tokens)
    positions = np.arange(t, dtype=np.float64)
    h = w["model.embed_tokens.weight"][tokens]
    experts, min_gap = {}, np.inf
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q = rms_norm((x @ w[p + "self_attn.q_proj.weight"].T).reshape(t, heads, dim), w[p + "self_attn.q_norm.weight"], eps)
        k = rms_norm((x @ w[p + "self_attn.k_proj.weight"].T).reshape(t, kv_heads, dim), w[p + "self_attn.k_norm.weight"], eps)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(t, kv_heads, dim)
        q, k = rope(q, positions, config["rope_theta"]), rope(k, positions, config["rope_theta"])
        out = np.zeros((t, heads, dim))
        mask = np.tril(np.ones((t, t), dtype=bool))
        for head in range(heads):
            kv = head // (heads // kv_heads)
            scores = q[:, head] @ k[:, kv].T / np.sqrt(dim)
            scores = np.where(mask, scores, -np.inf)
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            out[:, head] = (probs / probs.sum(-1, keepdims=True)) @ v[:, kv]
        h = h + out.reshape(t, heads * dim) @ w[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        if not is_moe(config, i):
            h = h + (silu(x @ w[p + "mlp.gate_proj.weight"].T) * (x @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
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
        if config["norm_topk_prob"]:
            gates = gates / gates.sum(-1, keepdims=True)
        moe = np.zeros_like(h)
        for row in range(t):
            for e, g in zip(chosen[row], gates[row]):
                e = f"{p}mlp.experts.{e}."
                act = silu(x[row] @ w[e + "gate_proj.weight"].T) * (x[row] @ w[e + "up_proj.weight"].T)
                moe[row] += g * (act @ w[e + "down_proj.weight"].T)
        h = h + moe
        experts[str(i)] = chosen.tolist()
    logits = rms_norm(h, w["model.norm.weight"], eps) @ w["lm_head.weight"].T
    return logits, experts, min_gap


def run_tool(model, load_format, tmp_path, vocab):
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(PROMPT))
    logits_file = tmp_path / "logits.f32"
    out = subprocess.run([str(TOOL), str(model), load_format, str(tokens), str(logits_file)], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    return np.fromfile(logits_file, dtype=np.float32).reshape(-1, vocab), json.loads(out.stdout)["experts"]


def write_gguf(path, config, weights):
    """What llama.cpp's converter writes for Qwen3-MoE: qwen3moe metadata, the experts stacked per layer."""
    writer = GGUFWriter(str(path), "qwen3moe")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_expert_count(config["num_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate": "ffn_gate_inp"}
    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    for i in range(config["num_hidden_layers"]):
        for hf, gguf in names.items():
            writer.add_tensor(f"blk.{i}.{gguf}.weight", weights[f"model.layers.{i}.{hf}.weight"])
        for proj, gguf in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
            stacked = np.stack([weights[f"model.layers.{i}.mlp.experts.{e}.{proj}.weight"]
                                for e in range(config["num_experts"])])
            writer.add_tensor(f"blk.{i}.{gguf}.weight", stacked)
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    writer.add_tensor("output.weight", weights["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def check_against_oracle(config, weights, logits, experts):
    expected, expected_experts, min_gap = oracle(config, weights, PROMPT)
    # fp32 router probabilities are good to ~1e-6; a smaller gap could flip a choice without any bug.
    assert min_gap > 1e-4, f"the test data has a near-tie in routing (gap {min_gap:.1e}): pick another seed"
    err = np.max(np.abs(logits - expected)) / np.max(np.abs(expected))
    assert err < 2e-5, f"max relative logit error {err:.2e}"
    assert experts == expected_experts


# norm_topk_prob on with one dense layer listed; off with every second layer sparse. Each with a weight seed whose
# routing has no near-tie.
CASES = {"norm_mlp_only": ({"norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [1]}, 11),
         "step2": ({"norm_topk_prob": False, "decoder_sparse_step": 2, "mlp_only_layers": []}, 10)}


@pytest.mark.parametrize("case", CASES)
def test_hf_checkpoint_matches_oracle(case, tmp_path):
    config = {**BASE, **CASES[case][0]}
    weights = random_weights(config, seed=CASES[case][1])
    logits, experts = run_tool(write_hf_dir(tmp_path / "hf", config, weights), "hf", tmp_path, config["vocab_size"])
    assert sorted(experts) == [str(i) for i in range(config["num_hidden_layers"]) if is_moe(config, i)]
    check_against_oracle(config, weights, logits, experts)


def test_gguf_stacked_experts_match_oracle(tmp_path):
    # llama.cpp keeps neither decoder_sparse_step nor mlp_only_layers and always renormalizes.
    config = {**BASE, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}
    weights = random_weights(config, seed=3)
    logits, experts = run_tool(write_gguf(tmp_path / "moe.gguf", config, weights), "gguf", tmp_path,
                               config["vocab_size"])
    check_against_oracle(config, weights, logits, experts)


def test_dummy_weights_route_every_token(tmp_path):
    config = {**BASE, **CASES["norm_mlp_only"][0]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    logits, experts = run_tool(tmp_path / "config.json", "dummy", tmp_path, config["vocab_size"])
    assert logits.shape == (len(PROMPT), config["vocab_size"]) and np.all(np.isfinite(logits))
    for rows in experts.values():
        assert len(rows) == len(PROMPT)
        for row in rows:
            assert len(set(row)) == config["num_experts_per_tok"] and all(0 <= e < config["num_experts"] for e in row)


def test_missing_expert_is_a_clear_error(tmp_path):
    config = {**BASE, **CASES["norm_mlp_only"][0]}
    weights = random_weights(config, seed=1)
    del weights["model.layers.2.mlp.experts.5.up_proj.weight"]
    write_hf_dir(tmp_path / "hf", config, weights)
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(PROMPT))
    out = subprocess.run([str(TOOL), str(tmp_path / "hf"), "hf", str(tokens), str(tmp_path / "x.f32")],
                         capture_output=True, text=True)
    assert out.returncode == 1
    assert "model.layers.2.mlp.experts.5.up_proj.weight" in out.stderr
