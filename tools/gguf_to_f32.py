#!/usr/bin/env python3
"""Write an F32 copy of a GGUF file: the same metadata (types kept), every tensor dequantized to F32 with
gguf-py's reference dequantizer. llama.cpp parity tests run llama.cpp on the copy so that both engines see
exactly the same fp32 weights.

Usage: gguf_to_f32.py IN.gguf OUT.gguf
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize


def field_value(field):
    """The Python value of a metadata field; much faster than ReaderField.contents() on large arrays."""
    main = field.types[0]
    if main != GGUFValueType.ARRAY:
        return field.contents()
    sub = field.types[-1]
    if len(field.types) > 2:  # nested arrays: rare, small
        return field.contents()
    if sub == GGUFValueType.STRING:
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    if not field.data:
        return []
    return np.concatenate([field.parts[i] for i in field.data]).tolist()


def copy_metadata(reader, writer, skip=()):
    """Copies every key/value except the reader's virtual GGUF.* fields, general.architecture (the writer adds
    it) and `skip`."""
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in skip:
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY and len(field.types) == 2 else None
        writer.add_key_value(key, field_value(field), field.types[0], sub_type=sub)


def tensor_f32(tensor):
    """The tensor dequantized to fp32, shaped row-major (ggml dims reversed)."""
    data = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    return data.reshape([int(d) for d in reversed(tensor.shape)])


def main(src, dst):
    reader = GGUFReader(src)
    arch = field_value(reader.fields["general.architecture"])
    writer = GGUFWriter(dst, arch)
    copy_metadata(reader, writer, skip={"general.file_type"})
    writer.add_file_type(0)  # ALL_F32
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor_f32(tensor), raw_dtype=GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
