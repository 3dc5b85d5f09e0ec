"""Causal prefill attention through PyTorch scaled_dot_product_attention, the peer of prefill_attention_bench.

Same shapes as the C++ benchmark (Llama-3.1-8B heads: 32 query heads, 8 KV heads, head_dim 128, bf16), one prompt
of L tokens attending causally to itself, on contiguous Q [1, 32, L, 128] and K/V [1, 8, L, 128] (GQA through
enable_gqa; a backend that refuses it gets K/V expanded to 32 heads, outside the timed region). TFLOP/s counts the
visible scores only: 4 * 128 * 32 * L(L+1)/2. Usage: python3 sdpa_prefill_bench.py [--quick] [--csv FILE]
"""

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from sdpa_decode_bench import HEAD_DIM, HEADS, KV_HEADS, time_ms

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--csv")
    args = parser.parse_args()
    contexts = [4096, 32768] if args.quick else [4096, 16384, 32768, 131072]
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    rows = []
    for context in contexts:
        q = torch.randn(1, HEADS, context, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, KV_HEADS, context, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, KV_HEADS, context, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        flops = 4.0 * HEAD_DIM * HEADS * context * (context + 1) / 2
        for name, backend in BACKENDS.items():
            ms = None
            for gqa in (True, False):
                kk, vv = (k, v) if gqa else (k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1))
                try:
                    with sdpa_kernel([backend]):
                        ms = time_ms(lambda i: F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa),
                                     2, 3 if args.quick else 5)
                    break
                except RuntimeError as err:  # the backend does not take this shape
                    print(f"{name:6s} context {context:6d} gqa={gqa}: unsupported ({str(err).splitlines()[0][:80]})")
            if ms is None:
                continue
            tflops = flops / (ms * 1e-3) / 1e12
            rows.append((name, context, ms, tflops))
            print(f"{name:6s} context {context:6d} {ms:10.2f} ms  {tflops:7.1f} TFLOP/s", flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("backend,context,ms,tflops\n")
            for name, context, ms, tflops in rows:
                f.write(f"{name},{context},{ms:.3f},{tflops:.2f}\n")


if __name__ == "__main__":
    main()
