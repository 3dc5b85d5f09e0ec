"""TurboQuant (arXiv 2504.19874) in numpy, written from the paper and vLLM's turboquant key path.

MSE: n = ||x|| (stored fp16), y = Pi x / n, idx_j = number of Lloyd-Max boundaries < y_j (torch.bucketize),
decode n * Pi^T c[idx]. Codebook: Lloyd-Max for N(0, 1/d), centroids initialized at the cell centres of
+-3.5 sigma, outer edges +-10.5 sigma, conditional means by the 200-point trapezoid rule per cell, at most
200 iterations, stop when no centroid moves by tol, then mirrored to exact symmetry.
Prod: MSE at b-1 bits, r = x - decode_mse(x), signs of S r (>= 0 -> 1), gamma = ||r|| (fp16);
decode adds sqrt(pi/2)/d * gamma * S^T sign.
Codes are a little-endian bit stream: code j at bits [j*b, (j+1)*b). Pi and S are taken from the engine (its
seeded generator); what is checked here is everything done with them.

KV slots (vLLM's turboquant_* kv-cache dtypes, triton_turboquant_store.py): per token and KV head, a key record
then a value record. Key: MSE codes then fp16 ||k||, or (8 bits) the e4m3 cast of k. Value: uniform codes over
the token's channels, scale = max((max - min) / (2^b - 1), 1e-8), q = clamp(trunc((v - min) / scale + 0.5)),
all fp32, then fp16 scale and fp16 min; it reads back as q * fp16(scale) + fp16(min). Norm correction divides
the centroid vector by its norm before scaling it by ||k||.

The paper's store (turboquant_2.5 / turboquant_3.5, section 4.3 of the paper): per stream, the D / 2 channels of
largest energy (sum of squares over the rows that fix them) are outliers, ordered outliers ascending then the rest
ascending; keys are prod codes per part (outliers at b + 1 bits, the rest at b), values MSE codes per part
(outliers at b + 1, the rest at b). Key record: MSE codes and QJL signs of the outliers, of the rest, then fp16
||k_O||, gamma_O, ||k_R||, gamma_R; value record: codes of the outliers, of the rest, then fp16 ||v_O||, ||v_R||.
"""
import numpy as np

from oracles import fp8

# vLLM's TQ_PRESETS: (key bits, value bits, norm correction); key bits 8 = e4m3 keys.
PRESETS = {
    "turboquant_k8v4": (8, 4, False),
    "turboquant_4bit_nc": (4, 4, True),
    "turboquant_k3v4_nc": (3, 4, True),
    "turboquant_3bit_nc": (3, 3, True),
}


def solve_lloyd_max(d, bits, max_iter=200, tol=1e-10, points=200):
    n = 2 ** bits
    sigma2 = 1.0 / d
    sigma = np.sqrt(sigma2)
    lo, hi = -3.5 * sigma, 3.5 * sigma
    c = np.array([lo + (hi - lo) * (i + 0.5) / n for i in range(n)])
    pdf = lambda x: np.exp(-x * x / (2 * sigma2)) / np.sqrt(2 * np.pi * sigma2)
    for _ in range(max_iter):
        edges = np.concatenate([[lo * 3], (c[:-1] + c[1:]) / 2, [hi * 3]])
        new = c.copy()
        for i in range(n):
            x = np.linspace(edges[i], edges[i + 1], points)
            mass = np.trapezoid(pdf(x), x)
            if mass > 1e-15:
                new[i] = np.trapezoid(x * pdf(x), x) / mass
        if np.max(np.abs(new - c)) < tol:
            break
        c = new
    c = (c - c[::-1]) / 2  # exactly symmetric
    return c, (c[:-1] + c[1:]) / 2


def pack_bits(codes, bits):
    """codes [N, n] -> uint8 [N, ceil(n*bits/8)]."""
    codes = np.asarray(codes, dtype=np.uint32)
    stream = ((codes[..., None] >> np.arange(bits, dtype=np.uint32)) & 1).astype(np.uint8)
    return np.packbits(stream.reshape(codes.shape[0], -1), axis=1, bitorder="little")


def fp16_norm(v):
    return np.linalg.norm(v.astype(np.float64), axis=-1).astype(np.float32).astype(np.float16)


def mse_encode(x, rot, boundaries):
    x = np.asarray(x, dtype=np.float32)
    n = np.linalg.norm(x.astype(np.float64), axis=1)
    unit = np.divide(x.astype(np.float64), n[:, None], out=np.zeros(x.shape), where=n[:, None] > 0)
    y = unit @ rot.T
    return np.searchsorted(boundaries, y, side="left"), fp16_norm(x)


def mse_decode(idx, norm, rot, centroids):
    return (norm.astype(np.float64)[:, None] * (centroids[idx] @ rot)).astype(np.float32)


def qjl_encode(r, s):
    return (r.astype(np.float64) @ s.T >= 0).astype(np.uint8), fp16_norm(r)


def qjl_add(out, signs, rnorm, s):
    d = s.shape[0]
    gain = np.sqrt(np.pi / 2) / d * rnorm.astype(np.float64)
    return (out + gain[:, None] * ((2.0 * signs - 1.0) @ s)).astype(np.float32)


def select_outliers(x, count):
    energy = np.sum(np.asarray(x, np.float64) ** 2, axis=0)
    return np.sort(np.argsort(-energy, kind="stable")[:count])


def value_encode(v, bits):
    """v [N, D] -> codes [N, D], fp16 scale [N], fp16 min [N]."""
    v = np.asarray(v, np.float32)
    mn, mx = v.min(axis=1), v.max(axis=1)
    top = np.float32(2 ** bits - 1)
    scale = (mx - mn) / top
    scale = np.where(scale > np.float32(1e-8), scale, np.float32(1e-8)).astype(np.float32)
    q = np.clip(np.trunc((v - mn[:, None]) / scale[:, None] + np.float32(0.5)), 0, top).astype(np.uint8)
    return q, scale.astype(np.float16), mn.astype(np.float16)


def value_decode(q, scale, mn):
    return q.astype(np.float32) * scale.astype(np.float32)[:, None] + mn.astype(np.float32)[:, None]


def kv_slots(k, v, preset, rot):
    """k, v [N, D] -> the slots uint8 [N, slot bytes] and the K/V they read back as (float32, original domain)."""
    key_bits, value_bits, nc = PRESETS[preset]
    k = np.asarray(k, np.float32)
    d = k.shape[1]
    if key_bits == 8:
        key_record = fp8.quantize(k, 1.0, "e4m3")
        keys = fp8.dequantize(key_record, 1.0, "e4m3")
    else:
        centroids, boundaries = solve_lloyd_max(d, key_bits)
        idx, norm = mse_encode(k, rot, boundaries)
        key_record = np.concatenate([pack_bits(idx, key_bits), norm.view(np.uint8).reshape(-1, 2)], axis=1)
        c = centroids[idx]
        gain = norm.astype(np.float64)
        if nc:
            length = np.linalg.norm(c, axis=1)
            gain = np.divide(gain, length, out=np.zeros_like(gain), where=length > 0)
        keys = ((gain[:, None] * c) @ rot).astype(np.float32)
    q, scale, mn = value_encode(v, value_bits)
    value_record = np.concatenate([pack_bits(q, value_bits), scale.view(np.uint8).reshape(-1, 2),
                                   mn.view(np.uint8).reshape(-1, 2)], axis=1)
    return np.concatenate([key_record, value_record], axis=1), keys, value_decode(q, scale, mn)


def channel_order(x, count):
    """The stream's channel order from rows x [N, D]: its `count` highest-energy channels, then the rest."""
    outliers = select_outliers(x, count)
    return np.concatenate([outliers, np.setdiff1d(np.arange(x.shape[1]), outliers)])


def fp16_bytes(*norms):
    return np.concatenate([n.view(np.uint8).reshape(-1, 2) for n in norms], axis=1)


def prod_kv_slots(k, v, bits, key_order, value_order, mats):
    """The paper's store: k, v [N, D] of one stream and its channel orders -> the slots uint8 [N, slot bytes] and
    the K/V they read back as (float32, original channels). mats: the engine's matrices by name, key_rot_out,
    key_rot_reg, key_qjl_out, key_qjl_reg, value_rot_out, value_rot_reg."""
    k, v = np.asarray(k, np.float32), np.asarray(v, np.float32)
    d = k.shape[1]
    o = d // 2
    parts = [(slice(0, o), bits + 1, "out"), (slice(o, d), bits, "reg")]
    ordered = k[:, key_order]
    key_codes, key_norms, key_deq = [], [], []
    for cols, b, name in parts:
        x = ordered[:, cols]
        rot, s = mats[f"key_rot_{name}"], mats[f"key_qjl_{name}"]
        centroids, boundaries = solve_lloyd_max(x.shape[1], b - 1)
        idx, norm = mse_encode(x, rot, boundaries)
        mse = mse_decode(idx, norm, rot, centroids)
        signs, rnorm = qjl_encode(x - mse, s)
        key_codes += [pack_bits(idx, b - 1), pack_bits(signs, 1)]
        key_norms += [norm, rnorm]
        key_deq.append(qjl_add(mse, signs, rnorm, s))
    keys = np.zeros_like(k)
    keys[:, key_order] = np.concatenate(key_deq, axis=1)
    ordered = v[:, value_order]
    value_codes, value_norms, value_deq = [], [], []
    for cols, b, name in parts:
        x = ordered[:, cols]
        rot = mats[f"value_rot_{name}"]
        centroids, boundaries = solve_lloyd_max(x.shape[1], b)
        idx, norm = mse_encode(x, rot, boundaries)
        value_codes.append(pack_bits(idx, b))
        value_norms.append(norm)
        value_deq.append(mse_decode(idx, norm, rot, centroids))
    values = np.zeros_like(v)
    values[:, value_order] = np.concatenate(value_deq, axis=1)
    slots = np.concatenate(key_codes + [fp16_bytes(*key_norms)] + value_codes + [fp16_bytes(*value_norms)], axis=1)
    return slots, keys, values
