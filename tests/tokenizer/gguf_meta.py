"""Reads the metadata key/values of a GGUF file (v2/v3) quickly, without the tensor data."""
import mmap
import struct

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def read_gguf_metadata(path, prefixes=("tokenizer.", "general.architecture")):
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        magic, version = struct.unpack_from("<4sI", buf, 0)
        if magic != b"GGUF" or version < 2:
            raise ValueError(f"{path}: not a GGUF v2/v3 file")
        _, n_kv = struct.unpack_from("<QQ", buf, 8)
        pos = 24
        out = {}

        def read_str(pos):
            (n,) = struct.unpack_from("<Q", buf, pos)
            return bytes(buf[pos + 8:pos + 8 + n]).decode("utf-8"), pos + 8 + n

        def read_val(t, pos):
            if t == _STRING:
                return read_str(pos)
            if t == _ARRAY:
                et, n = struct.unpack_from("<IQ", buf, pos)
                pos += 12
                if et in _SCALARS:
                    fmt = _SCALARS[et]
                    size = struct.calcsize(fmt)
                    vals = list(struct.unpack_from("<" + fmt[1] * n, buf, pos))
                    return vals, pos + size * n
                vals = []
                for _ in range(n):
                    v, pos = read_val(et, pos)
                    vals.append(v)
                return vals, pos
            fmt = _SCALARS[t]
            return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)

        for _ in range(n_kv):
            key, pos = read_str(pos)
            (t,) = struct.unpack_from("<I", buf, pos)
            val, pos = read_val(t, pos + 4)
            if key.startswith(prefixes):
                out[key] = val
        return out
    finally:
        buf.close()
