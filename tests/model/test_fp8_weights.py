"""Block-scaled FP8 checkpoints (config.json quantization_config {quant_method: fp8, fmt: e4m3, weight_block_size})
on the CPU: the test writes a random small Qwen3-MoE and a dense Qwen3 as Qwen3-*-FP8 checkpoints are written
(every projection an F8_E4M3 tensor beside a float32 weight_scale_inv per block; embeddings, norms, lm_head and
the router unquantized), and their logits must equal, bit for bit, those of the same model stored as the
dequantized float32 weights, which in turn match the numpy oracle of test_qwen3_moe.py. Blocks of 16x24 make
every weight span several blocks, partial ones at its edges included. --load-format dummy with such a config goes
through the same quantization, and a missing or mis-shaped scale and an unsupported quantization_config are clear
errors naming the tensor or the key."""
import json
import subprocess

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from numpy_reference import write_hf_dir
from test_qwen3_moe import BASE, CASES, PROMPT, TOOL, check_against_oracle, random_weights, run_tool

BLOCK = [16, 24]
FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": BLOCK}
MOE = {**BASE, **CASES["norm_mlp_only"][0]}
# The dense Qwen3 of the same shape; the oracle reads it as a MoE config whose every layer is dense.
DENSE = {k: v for k, v in BASE.items() if not k.startswith(("num_experts", "moe_"))} | {
    "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
DENSE_ORACLE = {**DENSE, "mlp_only_layers": list(range(BASE["num_hidden_layers"])), "decoder_sparse_step": 1,
                "norm_topk_prob": False}


def quantize(w, block):
    """e4m3 codes and float32 scale_inv [ceil(out / rows), ceil(in / cols)] of a float32 weight [out, in], with
    scale_inv = max|block| / 448 as DeepSeek's and Qwen's FP8 writers pick it; and the weight they read back as."""
    rows, cols = -(-w.shape[0] // block[0]), -(-w.shape[1] // block[1])
    scale = np.ones((rows, cols), np.float32)
    for i in range(rows):
        for j in range(cols):
            amax = np.abs(w[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]]).max()
            scale[i, j] = amax / np.float32(448.0) if amax > 0 else 1.0
    expanded = np.repeat(np.repeat(scale, block[0], 0), block[1], 1)[:w.shape[0], :w.shape[1]]
    codes = (w / expanded).astype(ml_dtypes.float8_e4m3fn)
    return codes, scale, codes.astype(np.float32) * expanded


def fp8_checkpoint(weights):
    """The stored tensors of the FP8 checkpoint (projections quantized) and the float32 weights they stand for."""
    stored, dequantized = {}, {}
    for name, w in weights.items():
        if name.endswith("_proj.weight"):
            codes, scale, w = quantize(w, BLOCK)
            stored[name], stored[name + "_scale_inv"] = codes, scale
        else:
            stored[name] = w
        dequantized[name] = w
    return stored, dequantized


def tool_error(model, load_format, tmp_path):
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(PROMPT))
    out = subprocess.run([str(TOOL), str(model), load_format, str(tokens), str(tmp_path / "x.f32")],
                         capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    return out.stderr


@pytest.mark.parametrize("config,oracle_config,seed", [(MOE, MOE, CASES["norm_mlp_only"][1]),
                                                      (DENSE, DENSE_ORACLE, 5)], ids=["qwen3_moe", "qwen3"])
def test_fp8_checkpoint_matches_dequantized(config, oracle_config, seed, tmp_path):
    stored, dequantized = fp8_checkpoint(random_weights(oracle_config, seed))
    assert sum(v.dtype == ml_dtypes.float8_e4m3fn for v in stored.values()) > 0
    fp8_dir = write_hf_dir(tmp_path / "fp8", {**config, "quantization_config": FP8}, stored)
    f32_dir = write_hf_dir(tmp_path / "f32", config, dequantized)
    logits, experts = run_tool(fp8_dir, "hf", tmp_path, config["vocab_size"])
    reference, reference_experts = run_tool(f32_dir, "hf", tmp_path, config["vocab_size"])
    # Dequantization is one fp32 multiply per element either way, so the two models are the same numbers.
    assert np.array_equal(logits, reference)
    assert experts == reference_experts
    check_against_oracle(oracle_config, dequantized, logits, experts)


def test_dummy_fp8_weights_are_quantized(tmp_path):
    plain, fp8 = tmp_path / "plain", tmp_path / "fp8"
    plain.mkdir()
    fp8.mkdir()
    (plain / "config.json").write_text(json.dumps(MOE))
    (fp8 / "config.json").write_text(json.dumps({**MOE, "quantization_config": FP8}))
    logits, experts = run_tool(fp8 / "config.json", "dummy", tmp_path, MOE["vocab_size"])
    again, _ = run_tool(fp8 / "config.json", "dummy", tmp_path, MOE["vocab_size"])
    unquantized, _ = run_tool(plain / "config.json", "dummy", tmp_path, MOE["vocab_size"])
    assert np.all(np.isfinite(logits)) and np.array_equal(logits, again)
    # The same random weights, rounded to e4m3 (3 mantissa bits): close to the unquantized model, not equal.
    err = np.max(np.abs(logits - unquantized)) / np.max(np.abs(unquantized))
    assert 0 < err < 0.2, err
    for rows in experts.values():
        assert all(len(set(row)) == MOE["num_experts_per_tok"] for row in rows)


def fp8_moe_dir(tmp_path, edit=None, quantization=FP8):
    stored, _ = fp8_checkpoint(random_weights(MOE, seed=1))
    if edit:
        edit(stored)
    return write_hf_dir(tmp_path / "hf", {**MOE, "quantization_config": quantization}, stored)


def test_missing_scale_is_a_clear_error(tmp_path):
    name = "model.layers.2.mlp.experts.5.up_proj.weight_scale_inv"
    err = tool_error(fp8_moe_dir(tmp_path, lambda w: w.pop(name)), "hf", tmp_path)
    assert name in err and "no scale" in err


def test_misshaped_scale_is_a_clear_error(tmp_path):
    name = "model.layers.0.self_attn.q_proj.weight_scale_inv"

    def edit(w):
        w[name] = w[name][:, :1].copy()

    err = tool_error(fp8_moe_dir(tmp_path, edit), "hf", tmp_path)
    assert name in err and "shape" in err


def test_fp8_tensor_without_quantization_config_is_an_error(tmp_path):
    err = tool_error(fp8_moe_dir(tmp_path, quantization=None), "hf", tmp_path)
    assert "F8_E4M3" in err and "quantization_config" in err and "model.layers.0.self_attn.q_proj.weight" in err


@pytest.mark.parametrize("bad,key", [({"weight_block_size": [128]}, "weight_block_size"),
                                     ({"weight_block_size": [0, 128]}, "weight_block_size"),
                                     ({"weight_block_size": None}, "weight_block_size"),
                                     ({"fmt": "e5m2"}, "fmt"),
                                     ({"quant_method": "gptq"}, "quant_method")])
@pytest.mark.parametrize("load_format", ["hf", "dummy"])
def test_unsupported_quantization_config_is_an_error(bad, key, load_format, tmp_path):
    quantization = {k: v for k, v in {**FP8, **bad}.items() if v is not None}
    model = fp8_moe_dir(tmp_path, quantization=quantization)
    err = tool_error(model / "config.json" if load_format == "dummy" else model, load_format, tmp_path)
    assert key in err and "config.json" in err
