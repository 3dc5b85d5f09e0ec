#!/usr/bin/env python3
"""Dense decode of HF transformers at the shape `sparse-engine bench decode` measures: the peer of its dense row.

Random weights from a config.json (bf16, on the GPU), B random prompts of --input-len tokens prefilled in one
forward (SDPA attention, logits of the last position only), then greedy decode with the default dynamic KV cache:
--warmup-steps untimed, --steps timed. Prints one Markdown row per batch and appends CSV rows in the layout of
`bench decode --csv` (method "hf-transformers").

    python bench/hf_decode_peer.py --config bench/models/llama-3.1-8b/config.json --input-len 32768 --batch 1,4
"""
import argparse
import csv
import os
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def decode_rate(model, batch, input_len, warmup, steps, vocab):
    ids = torch.randint(100, min(vocab, 30000), (batch, input_len), device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        torch.cuda.synchronize()
        prefill_s = time.perf_counter() - start
        cache = out.past_key_values
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        for step in range(warmup + steps):
            if step == warmup:
                torch.cuda.synchronize()
                begin = time.perf_counter()
            out = model(input_ids=token, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            token = out.logits[:, -1].argmax(-1, keepdim=True)
        torch.cuda.synchronize()
    window = time.perf_counter() - begin
    return prefill_s, 1e3 * window / steps, batch * steps / window


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--input-len", type=int, default=32768)
    parser.add_argument("--batch", default="1")
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--warmup-steps", type=int, default=32)
    parser.add_argument("--csv", default="")
    args = parser.parse_args()

    config = AutoConfig.from_pretrained(os.path.dirname(os.path.abspath(args.config)))
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16, attn_implementation="sdpa")
    model.eval()
    name = os.path.basename(os.path.dirname(os.path.abspath(args.config)))
    print(f"HF transformers {__import__('transformers').__version__}, torch {torch.__version__}, {name}, "
          f"{args.input_len} prompt tokens, {args.warmup_steps} + {args.steps} decode steps")
    print("| batch | decode tok/s | ms/step | prefill s |\n|---|---|---|---|")
    for batch in (int(b) for b in args.batch.split(",")):
        try:
            prefill_s, step_ms, tok_s = decode_rate(model, batch, args.input_len, args.warmup_steps, args.steps,
                                                    config.vocab_size)
        except torch.OutOfMemoryError:
            print(f"| {batch} | out of memory |")
            torch.cuda.empty_cache()
            continue
        print(f"| {batch} | {tok_s:.1f} | {step_ms:.3f} | {prefill_s:.1f} |", flush=True)
        if args.csv:
            fresh = not os.path.exists(args.csv) or os.path.getsize(args.csv) == 0
            with open(args.csv, "a", newline="") as f:
                writer = csv.writer(f)
                if fresh:
                    writer.writerow(["model", "device", "method", "sparse_config", "input_len", "batch", "decode_tok_s",
                                     "step_ms", "weight_gb", "kv_gb_per_step", "roofline_ms", "of_roofline",
                                     "kv_pages_used", "kv_pages_total", "bandwidth_gbs", "prefill_s"])
                writer.writerow([name, "cuda", "hf-transformers", "{}", args.input_len, batch, f"{tok_s:.2f}",
                                 f"{step_ms:.4f}", "", "", "", "", "", "", "", f"{prefill_s:.2f}"])
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
