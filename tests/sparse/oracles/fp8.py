"""FP8 KV cache as vLLM writes it: cvt_satfinite(x / scale) (saturation to +-max as __NV_SATFINITE, NaN kept),
read back as float(fp8) * scale; calculate_kv_scales: k_scale = max|K| / 200, v_scale = max|V| / 100.
The fp8 rounding itself is ml_dtypes' (round to nearest-even, the same as torch.float8_e4m3fn / float8_e5m2)."""
import ml_dtypes
import numpy as np

FORMATS = {
    "e4m3": (ml_dtypes.float8_e4m3fn, 448.0),
    "e5m2": (ml_dtypes.float8_e5m2, 57344.0),
}
K_SCALE_CONSTANT = 200.0
V_SCALE_CONSTANT = 100.0


def to_fp8_codes(x, fmt):
    """fp32 values -> uint8 codes with satfinite (clipping first is the same as saturating after rounding:
    anything past max rounds to max or beyond)."""
    dtype, max_finite = FORMATS[fmt]
    x = np.asarray(x, dtype=np.float32)
    return np.clip(x, -max_finite, max_finite).astype(dtype).view(np.uint8)


def from_fp8_codes(codes, fmt):
    dtype, _ = FORMATS[fmt]
    return np.asarray(codes, dtype=np.uint8).view(dtype).astype(np.float32)


def quantize(x, scale, fmt):
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN inputs are part of the contract
        return to_fp8_codes(np.asarray(x, dtype=np.float32) / np.float32(scale), fmt)


def dequantize(codes, scale, fmt):
    return from_fp8_codes(codes, fmt) * np.float32(scale)


def calculate_kv_scales(k, v):
    """One per-tensor scale each from the first batch."""
    k_max = np.float32(np.max(np.abs(k))) if np.size(k) else np.float32(0)
    v_max = np.float32(np.max(np.abs(v))) if np.size(v) else np.float32(0)
    k_scale = k_max / np.float32(K_SCALE_CONSTANT) if k_max > 0 else np.float32(1)
    v_scale = v_max / np.float32(V_SCALE_CONSTANT) if v_max > 0 else np.float32(1)
    return np.float32(k_scale), np.float32(v_scale)
