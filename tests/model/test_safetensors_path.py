"""The safetensors path: an HF directory written from the dequantized SmolLM2 GGUF (tools/gguf_to_hf.py) gives
the same logits and greedy continuations as loading the GGUF itself."""
import json
import subprocess
import sys

import numpy as np

from conftest import BUILD_DIR, CACHE_DIR, SOURCE_DIR, smollm2_gguf


def run_tool(model, prompts, tmp_path, tag):
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"prompts": prompts, "continue": 16}))
    logits_file = tmp_path / f"{tag}.f32"
    out = subprocess.run([str(BUILD_DIR / "tests" / "model" / "model_logits_tool"), str(model), str(request),
                          str(logits_file)], check=True, capture_output=True, text=True)
    return np.fromfile(logits_file, dtype=np.float32).reshape(len(prompts), -1), json.loads(out.stdout)


def test_hf_directory_matches_gguf(tmp_path):
    gguf = smollm2_gguf()
    hf_dir = CACHE_DIR / "smollm2-hf"
    if not (hf_dir / "model.safetensors").exists():
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, str(SOURCE_DIR / "tools" / "gguf_to_hf.py"), str(gguf), str(hf_dir)],
                       check=True)
    prompts = [[1, 9690, 198, 2683, 359, 253, 5356, 5646], list(range(200, 520)), [4093, 198, 1780, 314]]
    gguf_logits, gguf_out = run_tool(gguf, prompts, tmp_path, "gguf")
    hf_logits, hf_out = run_tool(hf_dir, prompts, tmp_path, "hf")
    err = np.max(np.abs(hf_logits - gguf_logits)) / np.max(np.abs(gguf_logits))
    assert err < 1e-6, f"max relative logit error {err:.2e}"
    assert hf_out["continuations"] == gguf_out["continuations"]
