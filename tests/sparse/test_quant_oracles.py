"""The KV quantizers (FP8, KIVI, TurboQuant) against their numpy oracles, through quant_tool: stored bytes,
codes, scales and minima bit for bit; decoded values as the oracle decodes them."""
import os
import pathlib
import subprocess

import ml_dtypes
import numpy as np
import pytest

from oracles import fp8, kivi, turboquant

TOOL = pathlib.Path(os.environ.get("SE_BUILD_DIR", pathlib.Path(__file__).resolve().parents[2] / "build")) \
    / "tests" / "sparse" / "quant_tool"


def run(*args):
    if not TOOL.exists():
        pytest.fail(f"{TOOL} is missing: build the quant_tool target")
    return subprocess.run([str(TOOL), *map(str, args)], check=True, capture_output=True, text=True).stdout


def load(path, dtype):
    return np.fromfile(path, dtype=dtype)


# ---------------------------------------------------------------- FP8

def fp8_sweep():
    """Every bf16 value, plus a dense fp32 sweep over the fp8 ranges: exact ties between fp8 neighbours, one fp32
    ulp either side of them, subnormals, values around the saturation point, infinities and NaN."""
    every_bf16 = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    parts = [every_bf16]
    for fmt in fp8.FORMATS:
        grid = fp8.from_fp8_codes(np.arange(256, dtype=np.uint8), fmt)
        grid = np.sort(grid[np.isfinite(grid)].astype(np.float64))
        mids = ((grid[:-1] + grid[1:]) / 2).astype(np.float32)  # exact in fp32: one more mantissa bit
        parts += [mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))]
        top = np.float32(fp8.FORMATS[fmt][1])
        parts.append(np.linspace(top * 0.9, top * 1.2, 4001, dtype=np.float32))
    rng = np.random.default_rng(7)
    parts.append((rng.standard_normal(20000) * np.exp(rng.uniform(-25, 14, 20000))).astype(np.float32))
    parts.append(np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38], np.float32))
    return np.concatenate(parts).astype(np.float32)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("scale", [1.0, 0.0123, 3.5])
def test_fp8_codes_match_ml_dtypes(fmt, scale, tmp_path):
    x = fp8_sweep()
    x.tofile(tmp_path / "x.f32")
    run("fp8", fmt, scale, tmp_path / "x.f32", tmp_path / "codes.u8")
    ours = load(tmp_path / "codes.u8", np.uint8)
    ref = fp8.quantize(x, scale, fmt)
    nan = np.isnan(fp8.from_fp8_codes(ref, fmt))
    assert np.array_equal(nan, np.isnan(fp8.from_fp8_codes(ours, fmt)))
    bad = np.flatnonzero((ours != ref) & ~nan)
    assert bad.size == 0, f"{bad.size} of {x.size} differ; first x={x[bad[0]]!r}: ours {ours[bad[0]]:#04x}, " \
                          f"ml_dtypes {ref[bad[0]]:#04x}"


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_decode_every_code(fmt, tmp_path):
    codes = np.arange(256, dtype=np.uint8)
    codes.tofile(tmp_path / "c.u8")
    run("fp8_decode", fmt, 0.5, tmp_path / "c.u8", tmp_path / "x.f32")
    ours = load(tmp_path / "x.f32", np.float32)
    ref = fp8.dequantize(codes, 0.5, fmt)
    assert np.array_equal(ours, ref, equal_nan=True)


def test_fp8_saturates_where_plain_casts_do_not():
    assert fp8.FORMATS["e4m3"][0] is ml_dtypes.float8_e4m3fn
    # ml_dtypes alone overflows to NaN / inf; the KV write saturates (both sides are checked above).
    assert np.isnan(np.float32(500).astype(ml_dtypes.float8_e4m3fn).astype(np.float32))
    assert fp8.dequantize(fp8.quantize(np.float32([500, -1e9]), 1.0, "e4m3"), 1.0, "e4m3").tolist() == [448, -448]


def test_fp8_calculate_kv_scales(tmp_path):
    rng = np.random.default_rng(3)
    k = (rng.standard_normal((3, 4, 64)) * 5).astype(np.float32)
    v = (rng.standard_normal((3, 4, 64)) * 0.2).astype(np.float32)
    k.tofile(tmp_path / "k.f32")
    v.tofile(tmp_path / "v.f32")
    run("fp8_scales", tmp_path / "k.f32", tmp_path / "v.f32", tmp_path / "s.f32")
    ours = load(tmp_path / "s.f32", np.float32)
    assert ours.tolist() == list(fp8.calculate_kv_scales(k, v))


# ---------------------------------------------------------------- KIVI

def kivi_input(rng, t, d):
    x = rng.standard_normal((t, d)).astype(np.float32)
    x[:, 3] *= 20.0          # an outlier channel, as keys have
    x[: min(t, 32), 5] = 0.75  # a constant key group (scale 0)
    x[7, :] = -1.5           # a constant value row
    return x


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("group,t,d", [(32, 128, 64), (32, 96, 128), (16, 40, 80), (64, 128, 72)])
@pytest.mark.parametrize("side", ["key", "value"])
def test_kivi_codes_scales_minima(bits, group, t, d, side, tmp_path):
    rng = np.random.default_rng(bits * 1000 + group + t + d)
    x = kivi_input(rng, t, d)
    x.tofile(tmp_path / "x.f32")
    run("kivi", side, bits, group, t, d, tmp_path / "x.f32", tmp_path / "q")
    codes, scale, mn = (kivi.quantize_keys if side == "key" else kivi.quantize_values)(x, group, bits)
    assert np.array_equal(load(tmp_path / "q.codes", np.uint32), codes.reshape(-1))
    assert np.array_equal(load(tmp_path / "q.scale", np.uint16), scale.view(np.uint16).reshape(-1))
    assert np.array_equal(load(tmp_path / "q.mn", np.uint16), mn.view(np.uint16).reshape(-1))
    n = t if side == "key" else d
    deq = kivi.dequantize_rows(codes, scale, mn, group, bits, n)
    deq = deq.T if side == "key" else deq
    assert np.array_equal(load(tmp_path / "q.deq", np.float32).reshape(t, d), deq)


def assert_kivi_arrays_equal(prefix, keys, values):
    """The codes, scales and minima quant_tool wrote at `prefix` equal the oracle's quantized keys and values."""
    (kc, ks, km), (vc, vs, vm) = keys, values
    for name, ref, dtype in [("kcodes", kc, np.uint32), ("kscale", ks, np.uint16), ("kmn", km, np.uint16),
                             ("vcodes", vc, np.uint32), ("vscale", vs, np.uint16), ("vmn", vm, np.uint16)]:
        ours = load(prefix.parent / f"{prefix.name}.{name}", dtype)
        ref = np.asarray(ref)
        ref = ref.view(np.uint16) if ref.dtype == np.float16 else ref.astype(dtype)
        assert np.array_equal(ours, ref.reshape(-1)), name


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("chunks,decode", [([300], 200), ([100, 100, 57], 150), ([64], 70), ([128], 1),
                                           ([20], 300)])
def test_kivi_residual_stream(bits, chunks, decode, tmp_path):
    residual, group, d = 64, 32, 64
    total = sum(chunks) + decode
    rng = np.random.default_rng(total + bits)
    k = kivi_input(rng, total, d)
    v = rng.standard_normal((total, d)).astype(np.float32)
    k.tofile(tmp_path / "k.f32")
    v.tofile(tmp_path / "v.f32")
    out = run("kivi_stream", bits, group, residual, d, tmp_path / "k.f32", tmp_path / "v.f32", tmp_path / "s",
              *chunks, *([1] * decode))
    stream = kivi.Stream(residual, group, bits, d)
    prefill = sum(chunks)
    stream.prefill(k[:prefill], v[:prefill])
    for t in range(prefill, total):
        stream.decode(k[t], v[t])
    qk, qv, keys, values = stream.quantized()
    assert out.split() == [str(qk), str(qv)]
    assert total - qk < residual and total - qv == min(total, residual)
    assert_kivi_arrays_equal(tmp_path / "s", keys, values)


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("chunks,kept_fraction", [([300], 0.5), ([100, 100, 57], 0.7), ([40, 190], 0.4), ([70], 0.5)])
def test_kivi_store_quantizes_only_the_kept_tokens_of_a_held_prompt(bits, chunks, kept_fraction, tmp_path):
    """Under a compress-after method the store evicts from the full-precision prompt, then quantizes the kept
    tokens: its groups are the oracle's prefill of exactly those tokens, in order."""
    residual, group, d = 64, 32, 64
    total = sum(chunks)
    rng = np.random.default_rng(total + bits)
    k = kivi_input(rng, total, d)
    v = rng.standard_normal((total, d)).astype(np.float32)
    kept = np.flatnonzero(rng.uniform(size=total) < kept_fraction).astype(np.int32)
    k.tofile(tmp_path / "k.f32")
    v.tofile(tmp_path / "v.f32")
    kept.tofile(tmp_path / "kept.i32")
    out = run("kivi_evicted", bits, group, residual, d, tmp_path / "k.f32", tmp_path / "v.f32", tmp_path / "kept.i32",
              tmp_path / "s", *chunks)
    stream = kivi.Stream(residual, group, bits, d)
    stream.prefill(k[kept], v[kept])
    qk, qv, keys, values = stream.quantized()
    assert out.split() == [str(qk), str(qv)]
    assert qk == len(kept) // residual * residual
    assert_kivi_arrays_equal(tmp_path / "s", keys, values)


# ---------------------------------------------------------------- TurboQuant

def tq_input(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    x[:, : d // 8] *= 6.0  # outlier channels
    x[0] = 0.0             # a zero vector
    return x


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
@pytest.mark.parametrize("d", [64, 128])
def test_turboquant_mse(bits, d, tmp_path):
    rng = np.random.default_rng(bits + d)
    n = 200
    x = tq_input(rng, n, d)
    x.tofile(tmp_path / "x.f32")
    run("turboquant", "mse", bits, 11, n, d, tmp_path / "x.f32", tmp_path / "t")
    rot = load(tmp_path / "t.rot", np.float64).reshape(d, d)
    centroids, boundaries = turboquant.solve_lloyd_max(d, bits)
    np.testing.assert_allclose(load(tmp_path / "t.centroids", np.float64), centroids, rtol=0, atol=1e-12)
    idx, norm = turboquant.mse_encode(x, rot, boundaries)
    assert np.array_equal(load(tmp_path / "t.codes", np.uint8).reshape(n, -1), turboquant.pack_bits(idx, bits))
    assert np.array_equal(load(tmp_path / "t.norm", np.uint16), norm.view(np.uint16))
    deq = turboquant.mse_decode(idx, norm, rot, centroids)
    np.testing.assert_allclose(load(tmp_path / "t.deq", np.float32).reshape(n, d), deq, rtol=0, atol=1e-5)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_turboquant_prod(bits, tmp_path):
    rng = np.random.default_rng(50 + bits)
    n, d = 200, 128
    x = tq_input(rng, n, d)
    x.tofile(tmp_path / "x.f32")
    run("turboquant", "prod", bits, 5, n, d, tmp_path / "x.f32", tmp_path / "t")
    rot = load(tmp_path / "t.rot", np.float64).reshape(d, d)
    s = load(tmp_path / "t.qjl", np.float64).reshape(d, d)
    centroids, boundaries = turboquant.solve_lloyd_max(d, bits - 1)
    idx, norm = turboquant.mse_encode(x, rot, boundaries)
    assert np.array_equal(load(tmp_path / "t.codes", np.uint8).reshape(n, -1), turboquant.pack_bits(idx, bits - 1))
    mse = turboquant.mse_decode(idx, norm, rot, centroids)
    signs, rnorm = turboquant.qjl_encode(x - mse, s)
    assert np.array_equal(load(tmp_path / "t.signs", np.uint8).reshape(n, -1), turboquant.pack_bits(signs, 1))
    assert np.array_equal(load(tmp_path / "t.rnorm", np.uint16), rnorm.view(np.uint16))
    deq = turboquant.qjl_add(mse, signs, rnorm, s)
    np.testing.assert_allclose(load(tmp_path / "t.deq", np.float32).reshape(n, d), deq, rtol=0, atol=1e-5)


@pytest.mark.parametrize("bits", [2, 3])
def test_turboquant_split(bits, tmp_path):
    rng = np.random.default_rng(90 + bits)
    n, d, count = 100, 128, 64
    x = tq_input(rng, n, d)
    x[:, 70:86] *= 4.0
    x.tofile(tmp_path / "x.f32")
    run("turboquant_split", bits, 3, n, d, count, tmp_path / "x.f32", tmp_path / "t")
    outliers = turboquant.select_outliers(x, count)
    assert np.array_equal(load(tmp_path / "t.outliers", np.int32), outliers)
    regular = np.setdiff1d(np.arange(d), outliers)
    codes, norms, deq = [], [], np.zeros((n, d), np.float32)
    for part, b, rot_name in [(outliers, bits + 1, "rot_out"), (regular, bits, "rot_reg")]:
        rot = load(tmp_path / f"t.{rot_name}", np.float64).reshape(part.size, part.size)
        centroids, boundaries = turboquant.solve_lloyd_max(part.size, b)
        idx, norm = turboquant.mse_encode(x[:, part], rot, boundaries)
        codes.append(turboquant.pack_bits(idx, b))
        norms.append(norm)
        deq[:, part] = turboquant.mse_decode(idx, norm, rot, centroids)
    assert np.array_equal(load(tmp_path / "t.codes", np.uint8).reshape(n, -1), np.concatenate(codes, axis=1))
    assert np.array_equal(load(tmp_path / "t.norm", np.uint16).reshape(n, 2),
                          np.stack(norms, axis=1).view(np.uint16))
    np.testing.assert_allclose(load(tmp_path / "t.deq", np.float32).reshape(n, d), deq, rtol=0, atol=1e-5)


@pytest.mark.parametrize("preset", sorted(turboquant.PRESETS))
@pytest.mark.parametrize("d", [64, 128])
def test_turboquant_kv_slots_bit_exact(preset, d, tmp_path):
    """The store's slots byte for byte as vLLM's store kernel lays them out, and what they read back as."""
    rng = np.random.default_rng(len(preset) * 10 + d)
    n = 150
    k = tq_input(rng, n, d)
    v = rng.standard_normal((n, d)).astype(np.float32) * 3.0
    v[1] = 0.25   # a constant value row: the scale floor
    k[2] *= 1e3   # past e4m3's range: the fp8 keys saturate
    k.tofile(tmp_path / "k.f32")
    v.tofile(tmp_path / "v.f32")
    run("turboquant_kv", preset, n, d, tmp_path / "k.f32", tmp_path / "v.f32", tmp_path / "t")
    key_bits = turboquant.PRESETS[preset][0]
    rot = load(tmp_path / "t.rot", np.float64).reshape(d, d) if key_bits != 8 else None
    slots, keys, values = turboquant.kv_slots(k, v, preset, rot)
    ours = load(tmp_path / "t.slots", np.uint8).reshape(n, -1)
    assert ours.shape == slots.shape
    bad = np.argwhere(ours != slots)
    assert bad.size == 0, f"{len(bad)} bytes differ, first at token {bad[0][0]} byte {bad[0][1]}"
    np.testing.assert_allclose(load(tmp_path / "t.k", np.float32).reshape(n, d), keys, rtol=1e-5,
                               atol=1e-5 * np.abs(keys).max())
    assert np.array_equal(load(tmp_path / "t.v", np.float32).reshape(n, d), values)
    # The slot is smaller than a bf16 key and value (4 * d bytes) by the preset's ratio.
    value_bits = turboquant.PRESETS[preset][1]
    key_bytes = d if key_bits == 8 else (d * key_bits + 7) // 8 + 2
    assert slots.shape[1] == key_bytes + (d * value_bits + 7) // 8 + 4


PAPER_STORES = {"turboquant_2.5": 2, "turboquant_3.5": 3}
PAPER_MATRICES = ["key_rot_out", "key_rot_reg", "key_qjl_out", "key_qjl_reg", "value_rot_out", "value_rot_reg"]


def paper_matrices(prefix, d):
    """The store's rotations and QJL matrices as quant_tool writes them: every part is d / 2 wide."""
    half = d // 2
    return {name: load(f"{prefix}.{name}", np.float64).reshape(half, half) for name in PAPER_MATRICES}


@pytest.mark.parametrize("store", sorted(PAPER_STORES))
@pytest.mark.parametrize("d", [64, 128])
def test_turboquant_paper_kv_slots_bit_exact(store, d, tmp_path):
    """The paper's store: the outlier split fixed from the stream's rows, then its slots byte for byte (prod keys,
    MSE values, two instances each) and what they read back as."""
    rng = np.random.default_rng(len(store) * 10 + d)
    n = 150
    k = tq_input(rng, n, d)
    k[:, 40:48] *= 5.0  # outliers away from the first channels too
    v = rng.standard_normal((n, d)).astype(np.float32) * 3.0
    v[:, d - 8:] *= 4.0
    k.tofile(tmp_path / "k.f32")
    v.tofile(tmp_path / "v.f32")
    run("turboquant_kv", store, n, d, tmp_path / "k.f32", tmp_path / "v.f32", tmp_path / "t")
    key_order, value_order = turboquant.channel_order(k, d // 2), turboquant.channel_order(v, d // 2)
    assert np.array_equal(load(tmp_path / "t.korder", np.int32), key_order)
    assert np.array_equal(load(tmp_path / "t.vorder", np.int32), value_order)
    slots, keys, values = turboquant.prod_kv_slots(k, v, PAPER_STORES[store], key_order, value_order,
                                                   paper_matrices(tmp_path / "t", d))
    ours = load(tmp_path / "t.slots", np.uint8).reshape(n, -1)
    assert ours.shape == slots.shape
    bad = np.argwhere(ours != slots)
    assert bad.size == 0, f"{len(bad)} bytes differ, first at token {bad[0][0]} byte {bad[0][1]}"
    np.testing.assert_allclose(load(tmp_path / "t.k", np.float32).reshape(n, d), keys, rtol=0, atol=1e-5)
    np.testing.assert_allclose(load(tmp_path / "t.v", np.float32).reshape(n, d), values, rtol=0, atol=1e-4)
    # b + 0.5 bits per coordinate for keys (MSE and sign bits) and values, plus six fp16 norms.
    bits = PAPER_STORES[store]
    assert slots.shape[1] * 8 == 2 * d * (bits + 0.5) + 6 * 16
