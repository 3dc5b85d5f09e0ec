"""Logits parity against llama.cpp (llama-cpp-python built from source), on F32 copies of the real GGUF models so
both sides compute from identical weights: the last-position logits of >= 20 prompts (short to 2K tokens) agree
to a max relative error < 1e-3, and 32-token greedy continuations are identical."""
import json
import subprocess

import numpy as np
import pytest

from conftest import BUILD_DIR, MODELS, f32_copy, with_metadata

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (scripts/install-deps.sh)")

NUM_CONTINUE = 32
SHORT_PROMPTS = [
    "What is the capital of France?",
    "Once upon a time",
    "def fibonacci(n):\n",
    "The quick brown fox jumps over the lazy dog.",
    "1, 2, 3, 4, 5,",
    "Translate to French: Good morning, my friend.",
    "東京は日本の首都です。",
    "List three primary colors:",
]


def long_prompts(count: int) -> list[str]:
    """Prose from the GPL-3 text Debian ships, cut to lengths growing up to ~2K tokens."""
    text = open("/usr/share/common-licenses/GPL-3", encoding="utf-8").read()
    words = text.split()
    sizes = np.geomspace(40, 1500, count).astype(int)
    return [" ".join(words[i * 7: i * 7 + n]) for i, n in enumerate(sizes)]


def last_logits(llm):
    """Logits of the last evaluated token (llama-cpp-python keeps no scores unless logits_all is set)."""
    return np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),)).astype(np.float32)


def reference(model_path, prompts_ids):
    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=2600, n_batch=512, n_threads=2, verbose=False,
                          type_k=0, type_v=0, flash_attn=False)  # F32 KV cache: no f16 rounding on the oracle side
    logits, continuations = [], []
    for ids in prompts_ids:
        llm.reset()
        llm.eval(ids)
        logits.append(last_logits(llm))
        out = []
        for _ in range(NUM_CONTINUE):
            tok = int(np.argmax(last_logits(llm)))
            out.append(tok)
            llm.eval([tok])
        continuations.append(out)
    return llm, np.stack(logits), continuations


def ours(model_path, prompts_ids, tmp_path):
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"prompts": prompts_ids, "continue": NUM_CONTINUE}))
    logits_file = tmp_path / "logits.f32"
    result = subprocess.run([str(BUILD_DIR / "tests" / "model" / "model_logits_tool"), str(model_path),
                             str(request), str(logits_file)], check=True, capture_output=True, text=True)
    continuations = json.loads(result.stdout)["continuations"]
    logits = np.fromfile(logits_file, dtype=np.float32).reshape(len(prompts_ids), -1)
    return logits, continuations


def expect_parity(model, prompts, tmp_path):
    tokenizer = llama_cpp.Llama(model_path=str(model), vocab_only=True, verbose=False)
    prompts_ids = [tokenizer.tokenize(p.encode(), add_bos=True, special=False) for p in prompts]
    _, ref_logits, ref_cont = reference(model, prompts_ids)
    our_logits, our_cont = ours(model, prompts_ids, tmp_path)

    for i, ids in enumerate(prompts_ids):
        err = np.max(np.abs(our_logits[i] - ref_logits[i])) / np.max(np.abs(ref_logits[i]))
        assert err < 1e-3, f"{model.name} prompt {i} ({len(ids)} tokens): max relative logit error {err:.2e}"
        assert our_cont[i] == ref_cont[i], f"{model.name} prompt {i}: greedy continuations differ"
    return prompts_ids, our_logits


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_logits_and_greedy_match_llama_cpp(name, tmp_path):
    prompts_ids, _ = expect_parity(f32_copy(MODELS[name]()), SHORT_PROMPTS + long_prompts(12), tmp_path)
    assert len(prompts_ids) >= 20 and max(len(p) for p in prompts_ids) >= 1500


# YaRN (factor 4 over a 2,048-token trained context) written into SmolLM2's metadata the way llama.cpp's converter
# writes it, once with the default magnitude scale and once with llama.cpp's attention factor on top.
@pytest.mark.parametrize("attn_factor", [None, 0.8])
def test_yarn_rope_matches_llama_cpp(attn_factor, tmp_path):
    extra = {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0,
             "llama.rope.scaling.original_context_length": 2048}
    if attn_factor is not None:
        extra["llama.rope.scaling.attn_factor"] = attn_factor
    plain = f32_copy(MODELS["smollm2"]())
    prompts_ids, yarn_logits = expect_parity(with_metadata(plain, f"yarn-{attn_factor}", extra),
                                             SHORT_PROMPTS[:4] + long_prompts(2), tmp_path)
    # The scaling is in effect on both sides: without it the logits move by several percent (measured 4.7-7.2%).
    plain_logits, _ = ours(plain, prompts_ids, tmp_path)
    assert np.max(np.abs(yarn_logits - plain_logits)) > 1e-2 * np.max(np.abs(plain_logits))
