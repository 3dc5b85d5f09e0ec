"""paged_attention over quantized pages (FP8 e4m3, KIVI and TurboQuant, attention_view.h's kQuantized layouts)
against attention computed in float64 over the K/V the numpy oracles dequantize (oracles/{fp8,kivi,turboquant}.py):
ragged batches mixing decode rows and prefill chunks, GQA groups 1, 4 and 8, page sizes 16 and 64, a sliding
window, and KIVI streams whose full-precision key window holds 0, some and R - 1 tokens."""
import os
import pathlib
import subprocess

import numpy as np
import pytest

from oracles import fp8, kivi, turboquant

TOOL = pathlib.Path(os.environ.get("SE_BUILD_DIR", pathlib.Path(__file__).resolve().parents[2] / "build")) \
    / "tests" / "sparse" / "quantized_attention_tool"
HEAD_DIM = 64
GQA = [(4, 4), (8, 2), (8, 1)]  # (query heads, KV heads): groups 1, 4, 8


def run(*args):
    if not TOOL.exists():
        pytest.fail(f"{TOOL} is missing: build the quantized_attention_tool target")
    return subprocess.run([str(TOOL), *map(str, args)], check=True, capture_output=True, text=True).stdout


def write_batch(tmp_path, lens, rows, num_heads, num_kv_heads, rng):
    """Random q [sum rows, H, D] and per-sequence k, v [len, Hkv, D], written as the tool reads them."""
    ks = [rng.standard_normal((n, num_kv_heads, HEAD_DIM)).astype(np.float32) for n in lens]
    vs = [rng.standard_normal((n, num_kv_heads, HEAD_DIM)).astype(np.float32) for n in lens]
    # A few outlier channels in the keys, as real keys have (and as KIVI's per-channel grouping is made for).
    for k in ks:
        k[:, :, :4] *= 8
    q = rng.standard_normal((sum(rows), num_heads, HEAD_DIM)).astype(np.float32)
    np.asarray(lens, np.int32).tofile(tmp_path / "lens.i32")
    np.asarray(rows, np.int32).tofile(tmp_path / "rows.i32")
    q.tofile(tmp_path / "q.f32")
    np.concatenate(ks).tofile(tmp_path / "k.f32")
    np.concatenate(vs).tofile(tmp_path / "v.f32")
    return q, ks, vs


def reference_attention(q, ks, vs, rows, num_heads, window):
    """Causal attention in float64: row r of a sequence's n rows sees keys [0, len - n + r] (the last `window` of
    them when window > 0); query head hq reads KV head hq // (H / Hkv)."""
    out = np.zeros(q.shape, np.float64)
    row0 = 0
    for k, v, n in zip(ks, vs, rows):
        group = num_heads // k.shape[1]
        for r in range(n):
            last = k.shape[0] - n + r
            first = max(0, last - window + 1) if window else 0
            for hq in range(num_heads):
                kk = k[first:last + 1, hq // group].astype(np.float64)
                vv = v[first:last + 1, hq // group].astype(np.float64)
                logits = kk @ q[row0 + r, hq].astype(np.float64) / np.sqrt(HEAD_DIM)
                p = np.exp(logits - logits.max())
                out[row0 + r, hq] = p @ vv / p.sum()
        row0 += n
    return out


def check(tmp_path, q, deq_k, deq_v, raw_k, raw_v, rows, num_heads, window):
    got = np.fromfile(tmp_path / "out.f32", np.float32).reshape(q.shape)
    want = reference_attention(q, deq_k, deq_v, rows, num_heads, window)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    # The quantization error is far above that tolerance, so the comparison tells quantized reads from raw ones.
    dense = reference_attention(q, raw_k, raw_v, rows, num_heads, window)
    assert np.max(np.abs(dense - want)) > 1e-3


LENS = [1, 37, 130, 64]
ROWS = [1, 1, 17, 64]  # decode rows, a prefill chunk and a whole prefill


@pytest.mark.parametrize("heads", GQA)
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("window", [0, 24])
def test_fp8_pages_match_the_oracle_dequantized_attention(heads, page_size, window, tmp_path):
    num_heads, num_kv_heads = heads
    rng = np.random.default_rng(num_heads * 100 + num_kv_heads + page_size + window)
    q, ks, vs = write_batch(tmp_path, LENS, ROWS, num_heads, num_kv_heads, rng)
    # Per-(layer, KV head) scales by vLLM's calculate_kv_scales rule, one per head.
    all_k, all_v = np.concatenate(ks), np.concatenate(vs)
    k_scales, v_scales = np.array([fp8.calculate_kv_scales(all_k[:, h], all_v[:, h])
                                   for h in range(num_kv_heads)], np.float32).T
    np.concatenate([k_scales, v_scales]).tofile(tmp_path / "scales.f32")
    run("fp8", num_heads, num_kv_heads, HEAD_DIM, page_size, window, tmp_path)

    def deq(x, scales):
        return np.stack([fp8.dequantize(fp8.quantize(x[:, h], scales[h], "e4m3"), scales[h], "e4m3")
                         for h in range(num_kv_heads)], axis=1)

    check(tmp_path, q, [deq(k, k_scales) for k in ks], [deq(v, v_scales) for v in vs], ks, vs, ROWS, num_heads,
          window)


GROUP = 32
RESIDUAL = 64
# Full-precision keys after the prefill: 40 (nothing quantized yet), 0 (len a multiple of R), 22, R - 1; and a
# stream of exactly R tokens (keys all quantized, values all full precision).
KIVI_LENS = [40, 128, 150, 191, 64]
KIVI_ROWS = [40, 1, 20, 1, 3]


def kivi_oracle(x_k, x_v, bits):
    """One head's K/V [len, D] as the oracle's KIVI stream holds them after the prefill, dequantized."""
    stream = kivi.Stream(RESIDUAL, GROUP, bits, HEAD_DIM)
    stream.prefill(x_k, x_v)
    nk, nv, (kc, ks, kmn), (vc, vs, vmn) = stream.quantized()
    keys = kivi.dequantize_rows(kc, ks, kmn, GROUP, bits, nk).T if nk else np.zeros((0, HEAD_DIM), np.float32)
    values = kivi.dequantize_rows(vc, vs, vmn, GROUP, bits, HEAD_DIM) if nv else np.zeros((0, HEAD_DIM), np.float32)
    return nk, nv, np.concatenate([keys, stream.key_full]), np.concatenate([values, stream.value_full])


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("heads", GQA)
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("window", [0, 48])
def test_kivi_pages_match_the_oracle_dequantized_attention(bits, heads, page_size, window, tmp_path):
    num_heads, num_kv_heads = heads
    rng = np.random.default_rng(bits * 1000 + num_heads * 100 + num_kv_heads + page_size + window)
    q, ks, vs = write_batch(tmp_path, KIVI_LENS, KIVI_ROWS, num_heads, num_kv_heads, rng)
    printed = run("kivi", bits, GROUP, GROUP, RESIDUAL, num_heads, num_kv_heads, HEAD_DIM, page_size, window,
                  tmp_path)
    deq_k, deq_v, counts = [], [], []
    for k, v in zip(ks, vs):
        heads_k, heads_v = [], []
        for h in range(num_kv_heads):
            nk, nv, dk, dv = kivi_oracle(k[:, h], v[:, h], bits)
            heads_k.append(dk)
            heads_v.append(dv)
        counts.append((nk, nv))
        deq_k.append(np.stack(heads_k, axis=1))
        deq_v.append(np.stack(heads_v, axis=1))
    assert [tuple(map(int, line.split())) for line in printed.splitlines()] == counts
    assert [len(k) - nk for k, (nk, _) in zip(ks, counts)] == [40, 0, 22, RESIDUAL - 1, 0]
    check(tmp_path, q, deq_k, deq_v, ks, vs, KIVI_ROWS, num_heads, window)


@pytest.mark.parametrize("preset", sorted(turboquant.PRESETS))
@pytest.mark.parametrize("heads", GQA)
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("window", [0, 24])
def test_turboquant_pages_match_the_oracle_dequantized_attention(preset, heads, page_size, window, tmp_path):
    """Attention scores MSE keys in the rotated domain; the oracle rotates them back and attends densely."""
    num_heads, num_kv_heads = heads
    rng = np.random.default_rng(len(preset) * 1000 + num_heads * 100 + num_kv_heads + page_size + window)
    q, ks, vs = write_batch(tmp_path, LENS, ROWS, num_heads, num_kv_heads, rng)
    key_bits = turboquant.PRESETS[preset][0]
    rot = None
    if key_bits != 8:  # the store's rotation, as quant_tool writes it
        subprocess.run([str(x) for x in (TOOL.parent / "quant_tool", "turboquant_kv", preset, 1, HEAD_DIM,
                                         tmp_path / "k.f32", tmp_path / "v.f32", tmp_path / "r")], check=True)
        rot = np.fromfile(tmp_path / "r.rot", np.float64).reshape(HEAD_DIM, HEAD_DIM)
    run("turboquant", preset, num_heads, num_kv_heads, HEAD_DIM, page_size, window, tmp_path)

    def deq(k, v):
        per_head = [turboquant.kv_slots(k[:, h], v[:, h], preset, rot)[1:] for h in range(num_kv_heads)]
        return np.stack([p[0] for p in per_head], axis=1), np.stack([p[1] for p in per_head], axis=1)

    pairs = [deq(k, v) for k, v in zip(ks, vs)]
    check(tmp_path, q, [p[0] for p in pairs], [p[1] for p in pairs], ks, vs, ROWS, num_heads, window)


PAPER_STORES = {"turboquant_2.5": 2, "turboquant_3.5": 3}


@pytest.mark.parametrize("store", sorted(PAPER_STORES))
@pytest.mark.parametrize("heads", GQA)
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("window", [0, 24])
def test_paper_turboquant_pages_match_the_oracle_dequantized_attention(store, heads, page_size, window, tmp_path):
    """The paper's store scores keys as [Pi q; S q] . [centroids; signs] per part and sums values rotated; the
    oracle decodes K (MSE plus the QJL term) and V in each head's channel order and attends densely."""
    num_heads, num_kv_heads = heads
    rng = np.random.default_rng(len(store) * 1000 + num_heads * 100 + num_kv_heads + page_size + window)
    q, ks, vs = write_batch(tmp_path, LENS, ROWS, num_heads, num_kv_heads, rng)
    subprocess.run([str(x) for x in (TOOL.parent / "quant_tool", "turboquant_kv", store, 1, HEAD_DIM,
                                     tmp_path / "k.f32", tmp_path / "v.f32", tmp_path / "r")], check=True)
    half = HEAD_DIM // 2
    mats = {name: np.fromfile(tmp_path / f"r.{name}", np.float64).reshape(half, half)
            for name in ["key_rot_out", "key_rot_reg", "key_qjl_out", "key_qjl_reg", "value_rot_out",
                         "value_rot_reg"]}
    run("turboquant", store, num_heads, num_kv_heads, HEAD_DIM, page_size, window, tmp_path)
    all_k, all_v = np.concatenate(ks), np.concatenate(vs)
    orders = [(turboquant.channel_order(all_k[:, h], half), turboquant.channel_order(all_v[:, h], half))
              for h in range(num_kv_heads)]

    def deq(k, v):
        per_head = [turboquant.prod_kv_slots(k[:, h], v[:, h], PAPER_STORES[store], *orders[h], mats)[1:]
                    for h in range(num_kv_heads)]
        return np.stack([p[0] for p in per_head], axis=1), np.stack([p[1] for p in per_head], axis=1)

    pairs = [deq(k, v) for k, v in zip(ks, vs)]
    check(tmp_path, q, [p[0] for p in pairs], [p[1] for p in pairs], ks, vs, ROWS, num_heads, window)
