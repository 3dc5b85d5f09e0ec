#!/usr/bin/env python3
"""Convert a llama / qwen2 / qwen3 / gemma3 GGUF into a Hugging Face model directory:
config.json, model.safetensors (F32, HF tensor names, llama Q/K rows un-permuted, Gemma norms back to w where
HF applies 1 + w) and, when transformers is installed, tokenizer.json + tokenizer_config.json built by its
GGUF tokenizer converter. Used to check that the safetensors path gives the same model as the GGUF path.

Usage: gguf_to_hf.py IN.gguf OUT_DIR
"""
import json
import math
import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader

from gguf_to_f32 import field_value, tensor_f32

ARCHS = {"llama": ("llama", "LlamaForCausalLM"), "qwen2": ("qwen2", "Qwen2ForCausalLM"),
         "qwen3": ("qwen3", "Qwen3ForCausalLM"), "gemma3": ("gemma3_text", "Gemma3ForCausalLM")}
LAYER_NAMES = {  # GGUF blk.N.<key> -> HF model.layers.N.<value>
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm"}
GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight"}


def hf_name(name, arch):
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    _, layer, key, suffix = name.split(".")
    if key == "ffn_norm":  # the pre-MLP norm: "post attention" in pre-norm models, its own norm in Gemma 3
        hf = "pre_feedforward_layernorm" if arch == "gemma3" else "post_attention_layernorm"
    else:
        hf = LAYER_NAMES[key]
    return f"model.layers.{layer}.{hf}.{suffix}"


def llama3_scaling(factors, theta, head_dim, original):
    """rope_scaling for llama.cpp's rope_freqs tensor, assuming the standard low/high frequency factors 1 and 4."""
    factor = float(max(factors))
    fit = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < original / 4:
            fit.append(1.0)
        elif wavelen > original:
            fit.append(factor)
        else:
            smooth = (original / wavelen - 1) / 3
            fit.append(1 / ((1 - smooth) / factor + smooth))
    if not np.allclose(fit, factors, rtol=1e-4):
        sys.exit("rope_freqs.weight does not follow the llama3 formula; HF config cannot express it")
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": original}


def hf_config(meta, tensors):
    arch = meta["general.architecture"]
    if arch not in ARCHS:
        sys.exit(f"unsupported GGUF architecture {arch!r}")
    k = lambda key, default=None: meta.get(f"{arch}.{key}", default)  # noqa: E731
    hidden, heads = k("embedding_length"), k("attention.head_count")
    head_dim = k("attention.key_length", hidden // heads)
    c = {"model_type": ARCHS[arch][0], "architectures": [ARCHS[arch][1]], "hidden_size": hidden,
         "intermediate_size": k("feed_forward_length"), "num_hidden_layers": k("block_count"),
         "num_attention_heads": heads, "num_key_value_heads": k("attention.head_count_kv", heads),
         "head_dim": head_dim, "rms_norm_eps": k("attention.layer_norm_rms_epsilon"),
         "rope_theta": k("rope.freq_base", 10000.0), "max_position_embeddings": k("context_length"),
         "vocab_size": len(meta["tokenizer.ggml.tokens"]), "tie_word_embeddings": "output.weight" not in tensors,
         "rope_scaling": None, "torch_dtype": "float32"}
    for gguf_key, key in [("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                          ("padding_token_id", "pad_token_id")]:
        if f"tokenizer.ggml.{gguf_key}" in meta:
            c[key] = meta[f"tokenizer.ggml.{gguf_key}"]
    scaling = k("rope.scaling.type")
    if scaling == "linear":
        c["rope_scaling"] = {"rope_type": "linear", "factor": k("rope.scaling.factor")}
    elif scaling == "yarn":
        c["rope_scaling"] = {"rope_type": "yarn", "factor": k("rope.scaling.factor"),
                             "original_max_position_embeddings": k("rope.scaling.original_context_length")}
    if "rope_freqs.weight" in tensors:
        c["rope_scaling"] = llama3_scaling(tensors["rope_freqs.weight"].tolist(), c["rope_theta"], head_dim,
                                           k("rope.scaling.original_context_length", 8192))
    if arch == "gemma3":
        c.update(hidden_activation="gelu_pytorch_tanh", sliding_window=k("attention.sliding_window", 4096),
                 sliding_window_pattern=6, rope_local_base_freq=10000.0,
                 query_pre_attn_scalar=hidden // heads if c["num_hidden_layers"] == 62 else head_dim,
                 final_logit_softcapping=k("final_logit_softcapping"),
                 attn_logit_softcapping=k("attn_logit_softcapping"))
    return c


def unpermute(w, n_head):
    """Inverse of convert_hf_to_gguf.py LlamaModel.permute on the rows of a Q/K weight or bias."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_tensors(reader, arch, config):
    out = {}
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            continue
        w = tensor_f32(t)
        name = hf_name(t.name, arch)
        if arch == "llama" and ".self_attn.q_proj." in name:
            w = unpermute(w, config["num_attention_heads"])
        elif arch == "llama" and ".self_attn.k_proj." in name:
            w = unpermute(w, config["num_key_value_heads"])
        elif arch == "gemma3" and name.endswith("norm.weight"):
            w = w - np.float32(1)  # GGUF stores the multiplier 1 + w
        out[name] = np.ascontiguousarray(w, dtype=np.float32)
    return out


def write_safetensors(path, tensors):
    """The safetensors format: u64 little-endian header length, JSON header, then the raw tensor bytes."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, w in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(w.shape), "data_offsets": [offset, offset + w.nbytes]}
        offset += w.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # align the data section
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for w in tensors.values():
            f.write(w.tobytes())


def write_tokenizer(meta, out_dir):
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (GGUF_TOKENIZER_MAPPING,
                                                                           convert_gguf_tokenizer)
    except ImportError:
        print("transformers not installed: no tokenizer.json written", file=sys.stderr)
        return
    groups = {group: {name: meta[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in meta}
              for group, renames in GGUF_TOKENIZER_MAPPING.items()}
    tokenizer, extra = convert_gguf_tokenizer(meta["general.architecture"], groups["tokenizer"])
    tokenizer.save(str(out_dir / "tokenizer.json"))
    tokens = meta["tokenizer.ggml.tokens"]
    tok_config = dict(groups["tokenizer_config"], **extra)
    for name, key in [("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")]:
        if f"tokenizer.ggml.{key}" in meta:
            tok_config[name] = tokens[meta[f"tokenizer.ggml.{key}"]]
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))


def main(src, out_dir):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    reader = GGUFReader(src)
    meta = {key: field_value(f) for key, f in reader.fields.items() if not key.startswith("GGUF.")}
    small = {t.name: tensor_f32(t) for t in reader.tensors if t.name == "rope_freqs.weight"}
    small.update({t.name: None for t in reader.tensors if t.name == "output.weight"})
    config = hf_config(meta, small)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    write_safetensors(out_dir / "model.safetensors", hf_tensors(reader, meta["general.architecture"], config))
    write_tokenizer(meta, out_dir)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
