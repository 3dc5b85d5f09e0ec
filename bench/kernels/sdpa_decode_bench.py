"""Decode attention through PyTorch scaled_dot_product_attention, the peer of decode_attention_bench.

Same shapes as the C++ benchmark (Llama-3.1-8B heads: 32 query heads, 8 KV heads, head_dim 128, bf16), one query
per sequence against contiguous K/V [B, 8, context, 128], GQA through enable_gqa. Each backend is timed with CUDA
events (median of many runs after warm-up), rotating among copies of K/V for small cases so that L2 does not
serve them. Usage: python3 sdpa_decode_bench.py [--quick] [--csv FILE]
"""

import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def time_ms(fn, warmup, reps):
    for i in range(warmup):
        fn(i)
    times = []
    for i in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn(warmup + i)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--csv")
    args = parser.parse_args()
    batches = [1, 16] if args.quick else [1, 4, 16, 64]
    contexts = [32768] if args.quick else [4096, 32768, 131072]
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    rows = []
    for batch in batches:
        for context in contexts:
            kv_bytes = batch * KV_HEADS * context * HEAD_DIM * 2 * 2
            sets = max(1, min(16, (1 << 30) // kv_bytes))
            q = torch.randn(batch, HEADS, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            kvs = [
                (
                    torch.randn(batch, KV_HEADS, context, HEAD_DIM, device="cuda", dtype=torch.bfloat16),
                    torch.randn(batch, KV_HEADS, context, HEAD_DIM, device="cuda", dtype=torch.bfloat16),
                )
                for _ in range(sets)
            ]
            nbytes = kv_bytes + 2 * q.numel() * 2
            for name, backend in BACKENDS.items():
                try:
                    with sdpa_kernel([backend]):

                        def run(i):
                            k, v = kvs[i % sets]
                            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

                        ms = time_ms(run, 5, 10 if args.quick else 30)
                except RuntimeError as err:  # the backend does not take this shape
                    print(f"{name:9s} batch {batch:2d} context {context:6d}: unsupported ({str(err).splitlines()[0][:80]})")
                    continue
                tbps = nbytes / (ms * 1e-3) / 1e12
                rows.append((name, batch, context, ms * 1e3, tbps))
                print(f"{name:9s} batch {batch:2d} context {context:6d} {ms * 1e3:9.1f} us  {tbps:.3f} TB/s", flush=True)
            del kvs, q
            torch.cuda.empty_cache()
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("backend,batch,context,us,tbps\n")
            for name, batch, context, us, tbps in rows:
                f.write(f"{name},{batch},{context},{us:.2f},{tbps:.4f}\n")


if __name__ == "__main__":
    main()
