"""Kara's selection (kara_selection.h) against the numpy oracle of our written interpretation (oracles/kara.py,
docs/fidelity.md "Kara: our interpretation") on random fp32 inputs: bidirectional window scores within 1e-5, and
per KV head identical kept sets and admitted Token2Chunk chunks, for random GQA shapes, window and buffer sizes,
candidate counts, budgets and length exponents; and the periodic policy."""
import numpy as np
import pytest

import decode_compression_harness as dh
from oracles import kara


def random_case(rng, seed):
    num_kv_heads = int(rng.choice([1, 2, 4]))
    num_heads = num_kv_heads * int(rng.choice([1, 2, 4]))
    window = int(rng.choice([32, 64, 128, 512])) if seed % 5 else int(rng.integers(1, 40))
    buffer = int(rng.choice([0, 16, 64]))
    budget = int(rng.integers(1, window + 8))
    params = {"budget": budget, "candidates": int(rng.integers(1, budget + 4)),
              "length_exponent": float(rng.choice([1.0, 0.5, 0.0, 2.0]))}
    if seed % 7 == 0:
        params = {}  # the defaults: K 64, R 160, gamma 1
        window, buffer = 512, 64
    q, k = dh.random_inputs(rng, window + buffer, window, num_heads, num_kv_heads, int(rng.choice([32, 64])))
    return params, q, k


@pytest.mark.parametrize("seed", range(60))
def test_kara_kept_sets_and_chunks_match_oracle(seed, tmp_path):
    rng = np.random.default_rng(3450 + seed)
    params, q, k = random_case(rng, seed)
    full = {"budget": 160, "candidates": 64, "length_exponent": 1.0, **params}
    out = dh.run(tmp_path, {"method": "kara", "params": params}, q, k)
    want_scores = kara.scores(q, k)
    np.testing.assert_allclose(np.array(out["scores"]), want_scores, rtol=1e-5, atol=1e-9)
    num_tokens = k.shape[0]
    for h in range(k.shape[1]):
        kept, chunks = kara.select(want_scores[h], full["candidates"], full["budget"], full["length_exponent"])
        assert out["kept"][h] == kept, f"KV head {h}"
        assert out["chunks"][h] == chunks, f"KV head {h}"
        assert len(kept) == min(full["budget"], num_tokens)
        for a, b in chunks:  # an admitted chunk is kept whole, endpoints included
            assert set(range(a, b + 1)) <= set(kept)


def test_kara_chunks_span_between_candidates(tmp_path):
    """Two strong tokens with a short gap become one kept span; a lone strong token far away stays isolated."""
    rng = np.random.default_rng(7)
    q, k = dh.random_inputs(rng, 40, 32, 1, 1, 16)
    k *= 0.01
    direction = q.mean(axis=0)[0]
    for t in (4, 8, 25):
        k[t, 0] = 10 * direction / np.linalg.norm(direction)  # the queries agree on these three
    out = dh.run(tmp_path, {"method": "kara", "params": {"budget": 7, "candidates": 3}}, q, k)
    assert {4, 5, 6, 7, 8, 25} <= set(out["kept"][0]) and len(out["kept"][0]) == 7
    assert out["chunks"][0] == [[4, 8]]
    kept, chunks = kara.select(kara.scores(q, k)[0], 3, 7)
    assert (out["kept"][0], out["chunks"][0]) == (kept, chunks)


@pytest.mark.parametrize("window,buffer,period", [(512, 64, 128), (64, 16, 10), (32, 0, 1), (100, 30, 7)])
def test_kara_trigger_steps(window, buffer, period, tmp_path):
    out = dh.run(tmp_path, {"method": "kara_trigger", "params": {"window": window, "buffer": buffer,
                                                                 "period": period}, "num_steps": 3000})
    assert out["fired"] == kara.trigger_steps(3000, window, buffer, period)
    assert out["fired"]
