"""Writes small seed inputs for the fuzzers: tiny GGUF models (every metadata type, several quant types) and
safetensors files. Usage: python fuzz/make_seeds.py OUT_DIR  (creates OUT_DIR/gguf and OUT_DIR/safetensors)."""
import json
import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T, GGUFWriter
from gguf.quants import quantize


def tiny_gguf(path: Path, arch: str, qtype: T) -> None:
    w = GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_token_list(["a", "b", "c", "d"])
    w.add_token_types([1, 1, 1, 3])
    w.add_token_scores([0.0, -1.0, -2.0, 0.0])
    w.add_bool("test.bool", True)
    w.add_float64("test.f64", 0.5)
    w.add_int8("test.i8", -3)
    w.add_array("test.nested", [[1, 2], [3]])
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (4, 32), "output_norm.weight": (32,), "blk.0.attn_norm.weight": (32,),
              "blk.0.attn_q.weight": (32, 32), "blk.0.attn_k.weight": (16, 32), "blk.0.attn_v.weight": (16, 32),
              "blk.0.attn_output.weight": (32, 32), "blk.0.ffn_norm.weight": (32,),
              "blk.0.ffn_gate.weight": (64, 32), "blk.0.ffn_up.weight": (64, 32), "blk.0.ffn_down.weight": (32, 64)}
    for name, shape in shapes.items():
        data = rng.standard_normal(shape).astype(np.float32)
        if len(shape) == 2 and qtype != T.F32:
            w.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def safetensors(path: Path, tensors: dict) -> None:
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, arr in tensors.items():
        raw = arr.tobytes()
        dtype = {np.float32: "F32", np.float16: "F16", np.int64: "I64", np.uint8: "U8"}[arr.dtype.type]
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main(out: Path) -> None:
    (out / "gguf").mkdir(parents=True, exist_ok=True)
    (out / "safetensors").mkdir(parents=True, exist_ok=True)
    # 32-wide rows fit the 32-element quant blocks only.
    for arch, qtype in [("llama", T.Q8_0), ("qwen2", T.Q4_0), ("gemma3", T.F32), ("qwen3", T.Q5_1)]:
        tiny_gguf(out / "gguf" / f"{arch}_{qtype.name}.gguf", arch, qtype)
    rng = np.random.default_rng(1)
    safetensors(out / "safetensors" / "a.safetensors",
                {"w": rng.standard_normal((3, 4)).astype(np.float32), "h": np.arange(6, dtype=np.float16),
                 "ids": np.arange(3, dtype=np.int64), "empty": np.zeros((0, 2), dtype=np.uint8)})


if __name__ == "__main__":
    main(Path(sys.argv[1]))
