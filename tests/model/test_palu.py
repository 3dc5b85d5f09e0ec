"""Palu (low-rank KV, the `palu` method) on the CPU reference path against a numpy oracle of Palu's reference module
(palu/model/modules/svd_linear.py: HeadwiseLowRankModule.from_linear, float64): per layer, W_k and W_v are cut into
groups of head_group_size KV heads, each group's rows factored by a plain SVD into L = U sqrt(S) and
R = sqrt(S) V^T truncated to the rank, the latents project(x) = x VT^T and the keys and values
reconstruct(h) = [h_g L_g^T + b_g]_g; the model attends with those (k_norm and RoPE after reconstruction, as the
module replaces k_proj). Random small Llama, Qwen2 (k/v biases) and Qwen3 (q/k norms) checkpoints as HF
directories: the engine's greedy tokens are the oracle's at half rank for one and two groups, its pool holds the
latents' bytes, and at half rank the oracle's tokens are not the dense model's (the rank matters)."""
import json
import re
import subprocess

import numpy as np
import pytest

from conftest import BUILD_DIR
from numpy_reference import RandomCheckpoint, rms_norm, silu, write_hf_dir

ENGINE_TOOL = BUILD_DIR / "tests" / "model" / "engine_greedy_tool"
ENGINE_KV_BYTES = 64 << 20  # engine_greedy_tool's KV pool
PAGE_SIZE = 4
BASE = {"vocab_size": 64, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 16, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "max_position_embeddings": 256, "tie_word_embeddings": False, "hidden_act": "silu",
        "bos_token_id": 1, "eos_token_id": 2}
ARCHS = {"llama": {"model_type": "llama", "architectures": ["LlamaForCausalLM"]},
         "qwen2": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "attention_bias": True},
         "qwen3": {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}}
PROMPT = [1, 17, 5, 33, 60, 8, 41, 2, 29, 12, 50, 3, 19, 44, 7, 23, 38, 11]


def random_weights(config, seed):
    checkpoint = RandomCheckpoint(config, seed)
    linear, norm, w = checkpoint.linear, checkpoint.norm, checkpoint.weights
    hidden, heads, kv_heads, dim = (config[k] for k in ("hidden_size", "num_attention_heads",
                                                        "num_key_value_heads", "head_dim"))
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        checkpoint.layer_norms(p, hidden)
        # Sharp attention, so that what the low rank drops changes the tokens.
        w[p + "self_attn.q_proj.weight"] = linear(heads * dim, hidden, gain=2.0)
        w[p + "self_attn.k_proj.weight"] = linear(kv_heads * dim, hidden, gain=2.0)
        w[p + "self_attn.v_proj.weight"] = linear(kv_heads * dim, hidden)
        w[p + "self_attn.o_proj.weight"] = linear(hidden, heads * dim)
        if config.get("attention_bias"):
            for name, rows in (("q", heads * dim), ("k", kv_heads * dim), ("v", kv_heads * dim)):
                w[p + f"self_attn.{name}_proj.bias"] = (0.3 * checkpoint.rng.standard_normal(rows)).astype(np.float32)
        if config["model_type"] == "qwen3":
            w[p + "self_attn.q_norm.weight"] = norm(dim)
            w[p + "self_attn.k_norm.weight"] = norm(dim)
        checkpoint.gated_mlp(p + "mlp.", config["intermediate_size"], hidden)
    return w


class HeadwiseLowRank:
    """Palu's HeadwiseLowRankModule.from_linear: `ranks` per group of out_features // len(ranks) rows."""

    def __init__(self, weight, bias, ranks):
        rows = weight.shape[0] // len(ranks)
        self.ranks, self.bias, us, vts = ranks, bias, [], []
        for g, rank in enumerate(ranks):
            u, s, vt = np.linalg.svd(weight[g * rows:(g + 1) * rows], full_matrices=False)
            root = np.sqrt(s[:rank])
            us.append(u[:, :rank] * root)           # L = U sqrt(S)
            vts.append(root[:, None] * vt[:rank])   # R = sqrt(S) V^T
        self.u, self.vt = us, np.concatenate(vts, 0)

    def project_to_latent(self, x):
        return x @ self.vt.T

    def reconstruct(self, latents):
        outputs, first = [], 0
        for u, rank in zip(self.u, self.ranks):
            outputs.append(latents[:, first:first + rank] @ u.T)
            first += rank
        out = np.concatenate(outputs, -1)
        return out if self.bias is None else out + self.bias


def rope(x, positions, theta):
    dim = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    angles = positions[:, None] * inv_freq[None, :]
    cos = np.cos(np.concatenate([angles, angles], -1))[:, None, :]
    sin = np.sin(np.concatenate([angles, angles], -1))[:, None, :]
    return x * cos + np.concatenate([-x[..., dim // 2:], x[..., :dim // 2]], -1) * sin


def oracle_logits(config, weights, tokens, groups=None, rank=None):
    """Logits of the last token; with `groups` and `rank`, k_proj and v_proj are Palu's modules of that many
    groups at that rank each."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    eps, heads, kv_heads, dim = (config[k] for k in ("rms_norm_eps", "num_attention_heads",
                                                     "num_key_value_heads", "head_dim"))
    t = len(tokens)
    positions = np.arange(t, dtype=np.float64)
    h = w["model.embed_tokens.weight"][tokens]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        proj = {}
        for name in ("q", "k", "v"):
            weight, bias = w[p + f"self_attn.{name}_proj.weight"], w.get(p + f"self_attn.{name}_proj.bias")
            if name != "q" and groups:
                module = HeadwiseLowRank(weight, bias, [rank] * groups)
                proj[name] = module.reconstruct(module.project_to_latent(x))
            else:
                proj[name] = x @ weight.T + (0 if bias is None else bias)
        q, k = proj["q"].reshape(t, heads, dim), proj["k"].reshape(t, kv_heads, dim)
        v = proj["v"].reshape(t, kv_heads, dim)
        if config["model_type"] == "qwen3":
            q, k = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps), rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q, positions, config["rope_theta"]), rope(k, positions, config["rope_theta"])
        out = np.zeros((t, heads, dim))
        mask = np.tril(np.ones((t, t), dtype=bool))
        for head in range(heads):
            kv = head // (heads // kv_heads)
            scores = np.where(mask, q[:, head] @ k[:, kv].T / np.sqrt(dim), -np.inf)
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            out[:, head] = (probs / probs.sum(-1, keepdims=True)) @ v[:, kv]
        h = h + out.reshape(t, heads * dim) @ w[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        h = h + (silu(x @ w[p + "mlp.gate_proj.weight"].T) * (x @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    return rms_norm(h[-1], w["model.norm.weight"], eps) @ w["lm_head.weight"].T


def oracle_greedy(config, weights, n, groups=None, rank=None):
    """n greedy tokens after PROMPT and the smallest top-1 / top-2 logit gap on the way."""
    tokens, gap = list(PROMPT), np.inf
    for _ in range(n):
        logits = oracle_logits(config, weights, tokens, groups, rank)
        top2 = np.sort(logits)[-2:]
        gap = min(gap, float(top2[1] - top2[0]))
        tokens.append(int(np.argmax(logits)))
    return tokens[len(PROMPT):], gap


def engine_greedy(model, tmp_path, max_tokens, max_batched_tokens, sparse_config):
    tokens = tmp_path / "prompt.json"
    tokens.write_text(json.dumps(PROMPT))
    out = subprocess.run([str(ENGINE_TOOL), str(model), "hf", str(tokens), str(max_tokens), str(max_batched_tokens),
                          str(PAGE_SIZE), "palu", json.dumps(sparse_config)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    capacity = int(re.search(r"(\d+) tokens per layer and KV head", out.stdout).group(1))
    return json.loads(out.stdout.splitlines()[-1])["tokens"], capacity


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("head_group_size", [4, 2])
def test_engine_greedy_matches_palu_oracle(arch, head_group_size, tmp_path):
    config = {**BASE, **ARCHS[arch]}
    weights = random_weights(config, seed=7)
    model = write_hf_dir(tmp_path / "hf", config, weights)
    groups = config["num_key_value_heads"] // head_group_size
    rank = head_group_size * config["head_dim"] // 2  # rank_ratio 0.5
    expected, gap = oracle_greedy(config, weights, 10, groups, rank)
    assert gap > 1e-3, f"the test data has a near-tie ({gap:.1e}): pick another seed"
    sparse_config = {"rank_ratio": 0.5, "head_group_size": head_group_size}
    for max_batched_tokens in (64, 5):
        tokens, capacity = engine_greedy(model, tmp_path, 10, max_batched_tokens, sparse_config)
        assert tokens == expected
        # The pool holds pages of PAGE_SIZE latent rows of 2 * rank values, one stream per layer and group.
        page_bytes = PAGE_SIZE * 2 * rank * 4
        streams = config["num_hidden_layers"] * groups
        assert capacity == ENGINE_KV_BYTES // page_bytes // streams * PAGE_SIZE
    # The rank matters: the dense model continues otherwise.
    assert oracle_greedy(config, weights, 10)[0] != expected

