"""The decode-time compression scores in PyTorch (f32 matmuls and softmaxes, as the R-KV and Kara reference code
writes them), the peer of decode_scoring_bench: the same shapes (32 query heads, 8 KV heads, head_dim 128), one layer
of one sequence per call, timed with CUDA events (median of 20 runs after warm-up). TF32 is off, so the matmuls are
f32 as ours are. Usage: python3 decode_scoring_peer.py [--csv FILE]
"""

import argparse
import statistics

import torch

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
GROUP = HEADS // KV_HEADS


def time_ms(fn, warmup=3, reps=20):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def window_logits(q, k):
    """[KV_HEADS, GROUP, rows, n] scaled logits of q [rows, HEADS, D] against k [n, KV_HEADS, D]."""
    qh = q.view(q.shape[0], KV_HEADS, GROUP, HEAD_DIM).permute(1, 2, 0, 3)
    kh = k.permute(1, 2, 0).unsqueeze(1)  # [KV_HEADS, 1, D, n]
    return torch.matmul(qh, kh) / HEAD_DIM**0.5


def group_max_attention_importance(q, k):
    return window_logits(q, k).amax(dim=1).softmax(dim=-1).mean(dim=1)


def bidirectional_window_scores(q, k):
    return window_logits(q, k).softmax(dim=-1).mean(dim=(1, 2))


def key_redundancy(k, threshold=0.5):
    unit = k.permute(1, 0, 2)
    unit = unit / (unit.norm(dim=-1, keepdim=True) + 1e-8)
    s = torch.bmm(unit, unit.transpose(1, 2))
    s.diagonal(dim1=1, dim2=2).zero_()
    t = s.shape[-1]
    newest = ((s > threshold) * torch.arange(t, device=s.device)).argmax(dim=-1, keepdim=True)
    s.scatter_(-1, newest, 0.0)
    return s.mean(dim=1).softmax(dim=-1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--csv")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(0)
    cases = [
        ("group_max_attention_importance", 8, 1144, 2.0 * 8 * HEADS * 1144 * HEAD_DIM, group_max_attention_importance),
        ("key_redundancy", 0, 1152, 2.0 * KV_HEADS * 1152 * 1152 * HEAD_DIM, lambda q, k: key_redundancy(k)),
        ("bidirectional_window_scores", 576, 512, 2.0 * 576 * HEADS * 512 * HEAD_DIM, bidirectional_window_scores),
    ]
    rows_out = []
    print("| op | window queries | keys | us (PyTorch) | dot products TFLOP/s |\n|---|---|---|---|---|")
    for name, rows, keys, flops, fn in cases:
        q = torch.randn(max(rows, 1), HEADS, HEAD_DIM, device="cuda", generator=gen)
        k = torch.randn(keys, KV_HEADS, HEAD_DIM, device="cuda", generator=gen)
        ms = time_ms(lambda: fn(q, k))
        tflops = flops / (ms * 1e-3) / 1e12
        print(f"| {name} | {rows} | {keys} | {ms * 1e3:.1f} | {tflops:.1f} |")
        rows_out.append(f"{name},{rows},{keys},{ms * 1e3:.2f},{tflops:.2f}")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("op,rows,keys,us,dot_tflops\n" + "\n".join(rows_out) + "\n")


if __name__ == "__main__":
    main()
