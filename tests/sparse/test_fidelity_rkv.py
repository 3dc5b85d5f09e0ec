"""R-KV's selection (rkv_scores.h) against the numpy oracle of its reference code (oracles/rkv.py) on random fp32
inputs: scores within 1e-5 and identical kept sets per KV head, for random GQA shapes, budgets, windows, lambdas
(the reference default 0.07 and the README's 0.1) and share of near-duplicate keys; and the decode trigger steps."""
import numpy as np
import pytest

import decode_compression_harness as dh
from oracles import rkv


@pytest.mark.parametrize("seed", range(40))
def test_rkv_kept_sets_match_reference(seed, tmp_path):
    rng = np.random.default_rng(3400 + seed)
    num_kv_heads = int(rng.choice([1, 2, 4]))
    num_heads = num_kv_heads * int(rng.choice([1, 2, 4]))
    window = int(rng.choice([8, 8, 4, 16]))
    num_tokens = int(rng.choice([200, 300, 1000])) if seed % 4 else int(rng.integers(window + 1, 160))
    budget = int(rng.integers(window + 1, max(window + 2, min(num_tokens, 512))))
    params = {"budget": budget, "window": window, "kernel": int(rng.choice([7, 7, 3, 1])),
              "mix_lambda": float(rng.choice([0.07, 0.1, 0.5]))}
    q, k = dh.random_inputs(rng, window, num_tokens, num_heads, num_kv_heads, int(rng.choice([32, 64])),
                            duplicates=float(rng.choice([0.0, 0.3])))
    out = dh.run(tmp_path, {"method": "rkv", "params": params}, q, k)
    if num_tokens > window:
        want = rkv.scores(q, k, window, params["kernel"], params["mix_lambda"])
        np.testing.assert_allclose(np.array(out["scores"]), want, rtol=1e-5, atol=1e-8)
    expect = rkv.kept(q, k, budget, window, params["kernel"], params["mix_lambda"])
    for h in range(num_kv_heads):
        assert out["kept"][h] == expect[h], f"KV head {h}"
        assert len(out["kept"][h]) == min(budget, num_tokens)


def test_rkv_redundancy_sees_duplicates(tmp_path):
    """A key repeated many times is the most redundant; its newest copy is left unpenalized by the others."""
    rng = np.random.default_rng(1)
    q, k = dh.random_inputs(rng, 8, 64, 2, 1, 32)
    for t in (10, 20, 30, 40):
        k[t] = k[5]
    red = rkv.redundancy(k[:, 0])
    assert red[5] > np.median(red) and red[10] > np.median(red)
    out = dh.run(tmp_path, {"method": "rkv", "params": {"budget": 16, "window": 8, "mix_lambda": 0.0}}, q, k)
    assert out["kept"][0] == rkv.kept(q, k, 16, 8, mix_lambda=0.0)[0]
    assert not {5, 10, 20, 30} & set(out["kept"][0])


@pytest.mark.parametrize("prompt_len,budget,buffer", [(100, 256, 128), (600, 256, 128), (50, 128, 64), (0, 64, 32)])
def test_rkv_trigger_steps(prompt_len, budget, buffer, tmp_path):
    out = dh.run(tmp_path, {"method": "rkv_trigger", "params": {"budget": budget, "buffer": buffer},
                            "prompt_len": prompt_len, "num_steps": 1000})
    assert out["fired"] == rkv.trigger_steps(prompt_len, 1000, budget, buffer)
    assert out["fired"], "the decode reaches budget + buffer"
