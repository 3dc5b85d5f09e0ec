"""KIVI (jy-yuan/KIVI @ 876b4d2), re-implemented in numpy from quant/new_pack.py and models/llama_kivi.py.

Quantization (triton_quantize_and_pack_along_last_dim): rows of the last dimension are cut into groups of
group_size; per group mn = min, scale = (max - mn) / (2^b - 1), q = round(clamp((x - mn) / scale, 0, 2^b - 1))
(torch.round: half to even), every op on fp16 tensors (rounded to fp16 after each op). Codes are packed 32 / b
per int32 word, element i of a word at bits [i*b, i*b + b). Dequantization: q * scale + mn in fp16.
Generalized to a shorter last group (the reference asserts full groups); a constant group (scale 0, where the
reference computes 0 / 0) gets code 0.

Residual bookkeeping (LlamaAttention_KIVI.forward): prefill of T tokens quantizes keys over the first
T - T mod R tokens (all if T mod R == 0, none if T < R) and values over all but the last R; each decode token
joins the full-precision keys, which are quantized all at once when they reach R, and the full-precision values,
whose oldest token is quantized once there are more than R.
"""
import numpy as np


def quantize_rows(x, group_size, bits):
    """x [rows, n] -> (codes uint32 [rows, ceil(n*b/32)], scale fp16 [rows, groups], mn fp16 [rows, groups])."""
    x = np.asarray(x, dtype=np.float32).astype(np.float16)
    rows, n = x.shape
    max_int = np.float16(2 ** bits - 1)
    num_groups = -(-n // group_size)
    scale = np.zeros((rows, num_groups), np.float16)
    mn = np.zeros((rows, num_groups), np.float16)
    q = np.zeros((rows, n), np.uint32)
    for g in range(num_groups):
        part = x[:, g * group_size:(g + 1) * group_size]
        lo = part.min(axis=1, keepdims=True)
        hi = part.max(axis=1, keepdims=True)
        s = (hi - lo) / max_int
        scale[:, g], mn[:, g] = s[:, 0], lo[:, 0]
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.clip((part - lo) / s, np.float16(0), max_int)
        codes = np.where(s > 0, np.round(t), np.float16(0))
        q[:, g * group_size:(g + 1) * group_size] = codes.astype(np.uint32)
    return pack(q, bits), scale, mn


def pack(q, bits):
    per_word = 32 // bits
    rows, n = q.shape
    words = -(-n * bits // 32)
    padded = np.zeros((rows, words * per_word), np.uint32)
    padded[:, :n] = q
    padded = padded.reshape(rows, words, per_word)
    shifts = (np.arange(per_word, dtype=np.uint32) * bits)[None, None, :]
    return np.bitwise_or.reduce(padded << shifts, axis=2).astype(np.uint32)


def unpack(codes, bits, n):
    per_word = 32 // bits
    shifts = (np.arange(per_word, dtype=np.uint32) * bits)[None, None, :]
    q = (codes[:, :, None] >> shifts) & np.uint32((1 << bits) - 1)
    return q.reshape(codes.shape[0], -1)[:, :n]


def dequantize_rows(codes, scale, mn, group_size, bits, n):
    q = unpack(codes, bits, n).astype(np.float16)
    s = np.repeat(scale, group_size, axis=1)[:, :n]
    m = np.repeat(mn, group_size, axis=1)[:, :n]
    return (q * s + m).astype(np.float32)


def quantize_keys(k, group_size, bits):
    """k [T, D] of one head, grouped per channel over tokens (the reference's transpose to [D, T])."""
    return quantize_rows(np.asarray(k).T, group_size, bits)


def quantize_values(v, group_size, bits):
    """v [T, D] of one head, grouped per token over channels."""
    return quantize_rows(v, group_size, bits)


class Stream:
    """One head's KIVI cache driven as the reference model drives it: prefill once, then one token per step."""

    def __init__(self, residual, group_size, bits, dim):
        self.residual, self.group_size, self.bits, self.dim = residual, group_size, bits, dim
        self.key_quant = []      # [D, tokens] blocks of quantized keys, in order
        self.key_full = np.zeros((0, dim), np.float32)
        self.value_quant = []    # [tokens, D] blocks of quantized values, in order
        self.value_full = np.zeros((0, dim), np.float32)

    def prefill(self, k, v):
        t, r = k.shape[0], self.residual
        split = t - t % r if t >= r else 0
        if split:
            self.key_quant.append(k[:split])
        self.key_full = k[split:]
        if t > r:
            self.value_quant.append(v[:t - r])
            self.value_full = v[t - r:]
        else:
            self.value_full = v

    def decode(self, k, v):
        self.key_full = np.concatenate([self.key_full, k[None]])
        if self.key_full.shape[0] == self.residual:
            self.key_quant.append(self.key_full)
            self.key_full = np.zeros((0, self.dim), np.float32)
        self.value_full = np.concatenate([self.value_full, v[None]])
        if self.value_full.shape[0] > self.residual:
            self.value_quant.append(self.value_full[:1])
            self.value_full = self.value_full[1:]

    def quantized(self):
        """Codes, scales and minima of every quantized block: keys per channel (blocks concatenated along each
        channel's row), values per token."""
        keys = [quantize_keys(b, self.group_size, self.bits) for b in self.key_quant]
        values = [quantize_values(b, self.group_size, self.bits) for b in self.value_quant]
        cat = lambda parts, i, axis: (np.concatenate([p[i] for p in parts], axis=axis) if parts else np.zeros(0))
        quantized_keys = sum(b.shape[0] for b in self.key_quant)
        quantized_values = sum(b.shape[0] for b in self.value_quant)
        return (quantized_keys, quantized_values,
                [cat(keys, i, 1) for i in range(3)], [cat(values, i, 0) for i in range(3)])
