"""Dequantization parity: our C++ decoders (through dequant_tool) against gguf-py's gguf.quants.dequantize,
bit for bit, on random blocks of every supported type."""
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import dequantize

TYPES = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K]
# Byte offsets of the fp16 scale fields in each block type (d, and dmin/m where present).
F16_FIELDS = {
    T.Q8_0: [0], T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2],
    T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
NUM_BLOCKS = 512


def tool_path() -> Path:
    build = os.environ.get("SE_BUILD_DIR")
    if not build:
        pytest.fail("SE_BUILD_DIR is not set; run through ctest")
    path = Path(build) / "tests/loader/dequant_tool"
    if not path.exists():
        pytest.fail(f"{path} is missing: build the dequant_tool target")
    return path


def random_finite_f16(rng, n):
    # Random finite halves over the whole range, subnormals and zeros included.
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    exp = (bits >> 10) & 0x1F
    bits[exp == 0x1F] &= np.uint16(0xBFFF)  # clear the top exponent bit: finite
    return bits


def random_blocks(rng, qtype):
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if qtype == T.F32:
        v = rng.standard_normal(NUM_BLOCKS).astype(np.float32)
        v[:8] = [0.0, -0.0, 1e-40, -1e-45, 3.4e38, -3.4e38, 1.0, -2.5]
        return v.view(np.uint8)
    if qtype == T.F16:
        return random_finite_f16(rng, NUM_BLOCKS).view(np.uint8)
    if qtype == T.BF16:
        bits = rng.integers(0, 1 << 16, size=NUM_BLOCKS, dtype=np.uint16)
        exp = (bits >> 7) & 0xFF
        bits[exp == 0xFF] &= np.uint16(0xBFFF)
        return bits.view(np.uint8)
    raw = rng.integers(0, 256, size=(NUM_BLOCKS, type_size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        raw[:, off:off + 2] = random_finite_f16(rng, NUM_BLOCKS).view(np.uint8).reshape(NUM_BLOCKS, 2)
    return raw.reshape(-1)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequant_matches_gguf_py(qtype, tmp_path):
    rng = np.random.default_rng(int(qtype) + 1234)
    raw = random_blocks(rng, qtype)
    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    raw.tofile(src)
    subprocess.run([str(tool_path()), str(int(qtype)), str(src), str(dst)], check=True)
    ours = np.fromfile(dst, dtype=np.float32)

    block_size, type_size = GGML_QUANT_SIZES[qtype]
    rows = raw.reshape(4, -1)  # several rows, as a tensor would have
    ref = np.asarray(dequantize(rows, qtype), dtype=np.float32).reshape(-1)
    assert ours.shape == ref.shape
    assert np.isfinite(ref).all()
    mismatch = np.flatnonzero(ours.view(np.uint32) != ref.view(np.uint32))
    assert mismatch.size == 0, (
        f"{qtype.name}: {mismatch.size} of {ref.size} values differ; first at {mismatch[0]}: "
        f"ours {ours[mismatch[0]]!r} vs gguf-py {ref[mismatch[0]]!r}")
