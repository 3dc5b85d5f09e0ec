"""What the float64 numpy oracles of the model tests (test_qwen3_moe.py, test_deepseek_v2.py) share: the HF
layers they restate, and the random HF checkpoints they write (the weights' scaling, the parts every decoder has,
the directory)."""
import json

import numpy as np
from safetensors.numpy import save_file


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def silu(x):
    return x / (1.0 + np.exp(-x))


class RandomCheckpoint:
    """Seeded float32 HF-named weights: linear weights of gain / sqrt(in), norm weights near 1. `weights` starts
    with the embedding, final norm and LM head; a test adds its layers through the methods below."""

    def __init__(self, config, seed):
        self.rng = np.random.default_rng(seed)
        hidden = config["hidden_size"]
        embed = self.rng.standard_normal((config["vocab_size"], hidden)).astype(np.float32)
        self.weights = {"model.embed_tokens.weight": embed, "model.norm.weight": self.norm(hidden),
                        "lm_head.weight": self.linear(config["vocab_size"], hidden)}

    def linear(self, out, inp, gain=1.0):
        return (self.rng.standard_normal((out, inp)) * gain / np.sqrt(inp)).astype(np.float32)

    def norm(self, n):
        return (1.0 + 0.1 * self.rng.standard_normal(n)).astype(np.float32)

    def layer_norms(self, prefix, hidden):
        self.weights[prefix + "input_layernorm.weight"] = self.norm(hidden)
        self.weights[prefix + "post_attention_layernorm.weight"] = self.norm(hidden)

    def gated_mlp(self, prefix, inter, hidden):
        """gate_proj, up_proj and down_proj under `prefix` (a dense MLP, one expert, or the shared experts)."""
        self.weights[prefix + "gate_proj.weight"] = self.linear(inter, hidden)
        self.weights[prefix + "up_proj.weight"] = self.linear(inter, hidden)
        self.weights[prefix + "down_proj.weight"] = self.linear(hidden, inter)


def write_hf_dir(path, config, weights):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(weights, str(path / "model.safetensors"))
    return path
