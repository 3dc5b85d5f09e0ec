"""ShadowKV's sketch and decode reads (shadowkv_sketch.h) against the numpy oracle of its reference code
(oracles/shadowkv.py) on random fp32 inputs: outlier chunks, landmarks, landmark scores, the chosen chunks, the
positions kept exact, and the chosen chunks' keys rebuilt from the low-rank factors and rotated."""
import json
import subprocess

import numpy as np
import pytest

from fidelity_harness import BUILD_DIR
from oracles import shadowkv

TOOL = BUILD_DIR / "tests" / "sparse" / "shadowkv_tool"
THETA = 10000.0


def run(tmp_path, params, pre_keys, queries):
    data = tmp_path / "data.bin"
    with open(data, "wb") as f:
        f.write(np.ascontiguousarray(pre_keys, dtype=np.float32).tobytes())
        f.write(np.ascontiguousarray(queries, dtype=np.float32).tobytes())
    case = {"params": params, "theta": THETA, "data": str(data), "num_tokens": pre_keys.shape[0],
            "num_kv_heads": pre_keys.shape[1], "head_dim": pre_keys.shape[2], "num_queries": queries.shape[0],
            "num_heads": queries.shape[1]}
    (tmp_path / "case.json").write_text(json.dumps(case))
    subprocess.run([str(TOOL), str(tmp_path / "case.json"), str(tmp_path / "out.json")], check=True)
    return json.loads((tmp_path / "out.json").read_text())


def low_rank_keys(rng, n, kv_heads, dim, true_rank):
    """Keys as real ones are: a few strong directions shared by the heads, plus noise."""
    basis = rng.standard_normal((true_rank, kv_heads * dim))
    coeff = rng.standard_normal((n, true_rank)) * np.linspace(3.0, 0.5, true_rank)
    keys = coeff @ basis + 0.05 * rng.standard_normal((n, kv_heads * dim))
    return keys.reshape(n, kv_heads, dim).astype(np.float32)


def check(out, params, pre_keys, queries):
    full = {"sparse_budget": 2048, "chunk_size": 8, "rank": 160, "local_chunks": 4, "outlier_chunks": 48, **params}
    cs = full["chunk_size"]
    n = pre_keys.shape[0]
    post = shadowkv.rope(pre_keys.astype(np.float64), np.arange(n), THETA)
    heads, chunks = shadowkv.sketch(post, cs, full["local_chunks"], full["outlier_chunks"])
    u, sv = shadowkv.low_rank(pre_keys, full["rank"])
    assert out["rank"] == u.shape[1]
    scores = shadowkv.chunk_scores(queries, [marks for _, _, marks in heads])
    for h, (outliers, rest, marks) in enumerate(heads):
        assert out["outliers"][h] == outliers, f"KV head {h}"
        assert out["landmark_chunks"][h] == rest, f"KV head {h}"
        np.testing.assert_allclose(np.array(out["landmarks"][h]).reshape(marks.shape), marks, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(out["scores"][h], scores[h], rtol=1e-4, atol=1e-7)
        chosen = shadowkv.choose(scores[h], rest, full["sparse_budget"], cs)
        assert out["chosen"][h] == chosen, f"KV head {h}"
        exact = sorted([c * cs + j for c in outliers for j in range(cs)] + list(range(chunks * cs, n)))
        assert out["exact"][h] == exact
        want = shadowkv.rebuild(u, sv, h, chosen, cs, THETA)
        got = np.array(out["rebuilt"][h]).reshape(want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("seed", range(24))
def test_shadowkv_matches_oracle(seed, tmp_path):
    rng = np.random.default_rng(3500 + seed)
    kv_heads = int(rng.choice([1, 2, 4]))
    heads = kv_heads * int(rng.choice([1, 2, 4]))
    dim = int(rng.choice([16, 32, 64]))
    cs = int(rng.choice([4, 8, 16]))
    outliers = int(rng.integers(0, 12))
    select = int(rng.integers(1, 16))
    local = int(rng.integers(0, 5))
    n = (outliers + select + local + int(rng.integers(1, 40))) * cs + int(rng.integers(0, cs))
    params = {"sparse_budget": select * cs, "chunk_size": cs, "rank": int(rng.integers(1, 48)),
              "local_chunks": local, "outlier_chunks": outliers}
    pre = low_rank_keys(rng, n, kv_heads, dim, int(rng.integers(1, 24)))
    queries = rng.standard_normal((int(rng.choice([1, 1, 3])), heads, dim)).astype(np.float32)
    check(run(tmp_path, params, pre, queries), params, pre, queries)


def test_shadowkv_defaults(tmp_path):
    """The reference's defaults (budget 2048, chunk 8, rank 160, 4 local and 48 outlier chunks) on a prompt just
    long enough for them."""
    rng = np.random.default_rng(35)
    pre = low_rank_keys(rng, 2600, 2, 128, 40)
    queries = rng.standard_normal((1, 8, 128)).astype(np.float32)
    out = run(tmp_path, {}, pre, queries)
    assert out["rank"] == 160
    check(out, {}, pre, queries)


def test_shadowkv_rebuild_is_exact_at_full_rank(tmp_path):
    """Keys of rank r are rebuilt exactly by r factors: the rebuilt chunks equal the rotated keys themselves."""
    rng = np.random.default_rng(8)
    n, cs = 200, 8
    basis = rng.standard_normal((6, 2 * 32))
    pre = (rng.standard_normal((n, 6)) @ basis).reshape(n, 2, 32).astype(np.float32)
    queries = rng.standard_normal((1, 4, 32)).astype(np.float32)
    params = {"sparse_budget": 40, "chunk_size": cs, "rank": 6, "local_chunks": 2, "outlier_chunks": 3}
    out = run(tmp_path, params, pre, queries)
    post = shadowkv.rope(pre.astype(np.float64), np.arange(n), THETA)
    for h in range(2):
        positions = [c * cs + j for c in out["chosen"][h] for j in range(cs)]
        got = np.array(out["rebuilt"][h]).reshape(len(positions), 32)
        np.testing.assert_allclose(got, post[positions, h], atol=1e-4)


def test_shadowkv_refuses_a_prompt_too_short(tmp_path):
    rng = np.random.default_rng(1)
    pre = rng.standard_normal((100, 1, 16)).astype(np.float32)
    with pytest.raises(subprocess.CalledProcessError):
        run(tmp_path, {}, pre, rng.standard_normal((1, 1, 16)).astype(np.float32))
