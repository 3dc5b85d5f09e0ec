"""Runs decode_compression_tool (R-KV's and Kara's selection functions on one layer) on synthetic fp32 inputs."""
import json
import subprocess

import numpy as np

from fidelity_harness import BUILD_DIR

TOOL = BUILD_DIR / "tests" / "sparse" / "decode_compression_tool"


def random_inputs(rng, num_queries, num_tokens, num_heads, num_kv_heads, head_dim, duplicates=0.0):
    """q [num_queries, H, d], k [num_tokens, Hkv, d] f32; a `duplicates` share of the keys are noisy copies of
    earlier keys, so the similarity threshold is crossed."""
    q = rng.standard_normal((num_queries, num_heads, head_dim), dtype=np.float32)
    k = rng.standard_normal((num_tokens, num_kv_heads, head_dim), dtype=np.float32)
    for t in np.flatnonzero(rng.random(num_tokens) < duplicates):
        if t > 0:
            src = int(rng.integers(0, t))
            k[t] = k[src] + 0.3 * rng.standard_normal(k[src].shape, dtype=np.float32)
    return q, k


def run(tmp_path, case, q=None, k=None):
    case = dict(case)
    if q is not None:
        data = tmp_path / "data.bin"
        with open(data, "wb") as f:
            f.write(np.ascontiguousarray(q, dtype=np.float32).tobytes())
            f.write(np.ascontiguousarray(k, dtype=np.float32).tobytes())
        case.update(data=str(data), num_queries=q.shape[0], num_heads=q.shape[1], head_dim=q.shape[2],
                    num_tokens=k.shape[0], num_kv_heads=k.shape[1])
    (tmp_path / "case.json").write_text(json.dumps(case))
    subprocess.run([str(TOOL), str(tmp_path / "case.json"), str(tmp_path / "out.json")], check=True)
    return json.loads((tmp_path / "out.json").read_text())
