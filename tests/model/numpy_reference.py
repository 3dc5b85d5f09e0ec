"""What the float64 numpy oracles of the model tests (test_qwen3_moe.py, test_deepseek_v2.py) share: the HF
layers they restate and the random HF checkpoint directory they write."""
import json

import numpy as np
from safetensors.numpy import save_file


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def silu(x):
    return x / (1.0 + np.exp(-x))


def write_hf_dir(path, config, weights):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(weights, str(path / "model.safetensors"))
    return path
