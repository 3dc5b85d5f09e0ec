"""The peer of sampling_bench: vLLM's PyTorch sampler on the same shapes and settings. Temperature scales the
logits; top-k and top-p mask a sorted copy (vLLM's apply_top_k_top_p: sort ascending, threshold, cumulative
softmax); min-p masks against the top probability; the token is the argmax of probs / Exp(1) noise (vLLM's
exponential race); the logprob of the sampled token comes from the unscaled log-softmax, as ours does. Greedy is
argmax plus that logprob. Times are CUDA-event medians of 20 runs after 3 warm-ups.

    python3 bench/kernels/sampling_peer.py [--csv FILE]"""
import argparse

import torch

VOCAB = 128256
SETTINGS = [("greedy", None), ("temperature 0.8", (0.8, 0, 1.0, 0.0)), ("top_k 50 top_p 0.95", (0.8, 50, 0.95, 0.0)),
            ("top_p 0.9", (1.0, 0, 0.9, 0.0)), ("min_p 0.05", (1.0, 0, 1.0, 0.05))]


def sample(logits, setting):
    logprobs = torch.log_softmax(logits, dim=-1)
    if setting is None:
        ids = logits.argmax(dim=-1)
        return ids, logprobs.gather(1, ids[:, None])
    temperature, top_k, top_p, min_p = setting
    scaled = logits / temperature
    if top_k > 0 or top_p < 1.0:
        sorted_logits, order = scaled.sort(dim=-1, descending=False)
        if top_k > 0:
            threshold = sorted_logits[:, -top_k][:, None]
            sorted_logits = sorted_logits.masked_fill(sorted_logits < threshold, float("-inf"))
        if top_p < 1.0:
            cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
            mask = cumulative <= 1 - top_p
            mask[:, -1] = False
            sorted_logits = sorted_logits.masked_fill(mask, float("-inf"))
        scaled = torch.empty_like(scaled).scatter_(-1, order, sorted_logits)
    probs = scaled.softmax(dim=-1)
    if min_p > 0:
        probs = probs.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, 0.0)
    ids = probs.div(torch.empty_like(probs).exponential_()).argmax(dim=-1)
    return ids, logprobs.gather(1, ids[:, None])


def time_ms(fn, warmup=3, reps=20):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return sorted(times)[len(times) // 2]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--csv")
    args = parser.parse_args()
    rows_out = ["rows,setting,us,logits_gbps"]
    print("| rows | setting | torch us | logits read GB/s |\n|---|---|---|---|")
    for rows in (1, 8, 32, 128, 256):
        logits = (torch.rand(rows, VOCAB, device="cuda") * 2 - 1) * 8
        for name, setting in SETTINGS:
            ms = time_ms(lambda: sample(logits, setting))
            gbps = logits.numel() * 4 / (ms * 1e-3) / 1e9
            print(f"| {rows} | {name} | {ms * 1e3:.1f} | {gbps:.0f} |")
            rows_out.append(f"{rows},{name},{ms * 1e3:.2f},{gbps:.1f}")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("\n".join(rows_out) + "\n")


if __name__ == "__main__":
    main()
