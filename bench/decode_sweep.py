#!/usr/bin/env python3
"""Runs `sparse-engine bench decode` over sparse methods, contexts and batch sizes and collects the results.

Each (method, context) is one `bench decode` process (the model loads once per process, a fresh engine per
batch). Rows are appended to one CSV; `--report` turns a CSV (this sweep's or an earlier one) into a Markdown
table with every method's ratio to dense `vanilla` at the same context and batch, and a PNG of decode tokens/s
against batch, one line per method and one panel per context (needs matplotlib).

    bench/decode_sweep.py --binary build/sparse-engine --model bench/models/llama-3.1-8b \\
        --contexts 32768 --batches 1,4,16 --methods vanilla,snapkv --csv bench/results/decode.csv
    bench/decode_sweep.py --report bench/results/decode.csv
"""
import argparse
import csv
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

# The protocol: every method at a 2048-token KV budget (Quest: 2048 tokens in 16-token pages).
METHOD_CONFIGS = {
    "vanilla": {},
    "snapkv": {"budget": 2048},
    "pyramidkv": {"budget": 2048},
    "streamingllm": {"budget": 2048},
    "h2o": {"budget": 2048},
    "quest": {"token_budget": 2048},
    "omnikv": {"num_selected_tokens": 2048},
}


def run_sweep(args) -> int:
    failures = 0
    for context in args.contexts.split(","):
        for method in args.methods.split(","):
            if method not in METHOD_CONFIGS:
                sys.exit(f"unknown method {method!r}; known: {', '.join(METHOD_CONFIGS)}")
            batches = args.batches if method == "vanilla" or not args.sparse_batches else args.sparse_batches
            command = [args.binary, "bench", "decode", "--model", args.model, "--load-format", args.load_format,
                       "--device", args.device, "--input-len", context, "--batch", batches,
                       "--steps", str(args.steps), "--warmup-steps", str(args.warmup_steps),
                       "--sparse-method", method, "--sparse-config", json.dumps(METHOD_CONFIGS[method]),
                       "--csv", args.csv, *args.extra]
            print("$", " ".join(command), flush=True)
            failures += subprocess.run(command).returncode != 0
    return failures


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def report(paths: list[str], plot: str | None) -> None:
    rows = [row for path in paths for row in read_rows(path)]
    dense = {(r["input_len"], r["batch"]): float(r["decode_tok_s"]) for r in rows if r["method"] == "vanilla"}
    print("| context | method | batch | decode tok/s | ms/step | of roofline | vs vanilla (same batch) |")
    print("|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (int(r["input_len"]), r["method"] != "vanilla", r["method"], int(r["batch"]))):
        base = dense.get((r["input_len"], r["batch"]))
        ratio = f"{float(r['decode_tok_s']) / base:.2f}x" if base else "-"
        of_roofline = f"{100 * float(r['of_roofline']):.0f}%" if r["of_roofline"] else "-"  # peers report none
        print(f"| {r['input_len']} | {r['method']} | {r['batch']} | {float(r['decode_tok_s']):.0f} | "
              f"{float(r['step_ms']):.2f} | {of_roofline} | {ratio} |")
    if not plot:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    contexts = sorted({int(r["input_len"]) for r in rows})
    fig, axes = plt.subplots(1, len(contexts), figsize=(6 * len(contexts), 4.5), squeeze=False)
    for ax, context in zip(axes[0], contexts):
        series = defaultdict(list)
        for r in rows:
            if int(r["input_len"]) == context:
                series[r["method"]].append((int(r["batch"]), float(r["decode_tok_s"])))
        for method, points in sorted(series.items()):
            points.sort()
            ax.plot([b for b, _ in points], [t for _, t in points], marker="o", label=method)
        ax.set(xscale="log", yscale="log", xlabel="batch (sequences)", ylabel="decode tokens/s",
               title=f"{context:,}-token prompts")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(plot, dpi=120)
    print(f"wrote {plot}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", default="build/sparse-engine")
    parser.add_argument("--model", default="bench/models/llama-3.1-8b")
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--contexts", default="32768")
    parser.add_argument("--methods", default=",".join(METHOD_CONFIGS))
    parser.add_argument("--batches", default="1,4,16", help="dense batches ('auto' or N,N...)")
    parser.add_argument("--sparse-batches", default="", help="batches of the sparse methods (default: --batches)")
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--warmup-steps", type=int, default=32)
    parser.add_argument("--csv", default="bench/results/decode.csv")
    parser.add_argument("--report", metavar="CSV", nargs="+", help="only print the table (and --plot) of these CSVs")
    parser.add_argument("--plot", metavar="PNG", help="with --report: also draw tokens/s vs batch")
    parser.add_argument("extra", nargs="*", help="more `bench decode` flags, after --")
    args = parser.parse_args()
    if args.report:
        report(args.report, args.plot)
        return 0
    Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
    failures = run_sweep(args)
    report([args.csv], args.plot)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
