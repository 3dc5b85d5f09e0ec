#!/usr/bin/env python3
"""Runs `sparse-engine bench throughput` as the long-generation benchmark of decode-time compression: short random
prompts, long outputs (EOS ignored), one fixed KV pool for every method, over concurrencies, and reports the
concurrency-throughput curve of each method with the ratios the decode-compression targets name.

Each (configuration, concurrency) is one process of `--concurrency C --num-prompts requests-per-slot x C`. The
configurations, all at one KV budget B of generated tokens per (layer, KV head):
    vanilla            dense
    snapkv-threshold   `rkv` at mix_lambda 1: SnapKV's score (the newest window's attention, max-pooled) under R-KV's
                       threshold trigger: at B + buffer generated tokens, compress back to B (the seed's baseline)
    rkv                R-KV: the same trigger, attention minus key redundancy
    kara               Kara's periodic window compression; its budget is what each window keeps, chosen so that the
                       whole output keeps about B: window x B / output-len, in whole pages
--method-config NAME=JSON merges settings into a configuration (e.g. a smaller Kara window for short CPU runs).
Rows are appended to one CSV; `--report` turns CSVs into the table and the ratios: Kara over the threshold baseline
and over dense at each concurrency, and whether Kara's throughput rises with every step of concurrency.

    bench/long_generation_sweep.py --model bench/models/llama-3.1-8b --input-len 1024 --output-len 16384 \\
        --budget 2048 --concurrencies 8,16,32,64,128 --csv bench/results/long_generation.csv \\
        -- --kv-cache-memory 64G
    bench/long_generation_sweep.py --report bench/results/long_generation.csv
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_sweep import read_rows  # noqa: E402

CONFIG_NAMES = ("vanilla", "snapkv-threshold", "rkv", "kara")
KARA_WINDOW = 512  # Kara's default window (`sparse-engine methods`)
PAGE = 16


def method_configs(budget: int, output_len: int, overrides: dict[str, dict]) -> dict[str, tuple[str, dict]]:
    """Each configuration's (method, sparse config) at a budget of `budget` generated tokens."""
    kara = {**overrides.get("kara", {})}
    window = kara.get("window", KARA_WINDOW)
    kara.setdefault("budget", max(PAGE, min(window, budget * window // output_len // PAGE * PAGE)))
    configs = {
        "vanilla": ("vanilla", {}),
        "snapkv-threshold": ("rkv", {"budget": budget, "mix_lambda": 1.0}),
        "rkv": ("rkv", {"budget": budget}),
        "kara": ("kara", kara),
    }
    for name, extra in overrides.items():
        if name != "kara":
            configs[name][1].update(extra)
    return configs


def config_name(row: dict) -> str:
    """The configuration a CSV row ran: its method, R-KV at mix_lambda 1 being the threshold baseline."""
    config = json.loads(row["sparse_config"] or "{}")
    if row["method"] == "rkv" and config.get("mix_lambda") == 1.0:
        return "snapkv-threshold"
    return row["method"]


def parse_overrides(items: list[str]) -> dict[str, dict]:
    overrides = {}
    for item in items:
        name, _, text = item.partition("=")
        if name not in CONFIG_NAMES:
            sys.exit(f"--method-config: unknown configuration {name!r}; known: {', '.join(CONFIG_NAMES)}")
        overrides[name] = json.loads(text)
    return overrides


def run_sweep(args) -> int:
    configs = method_configs(args.budget, args.output_len, parse_overrides(args.method_config))
    failures = 0
    for name in args.methods.split(","):
        if name not in configs:
            sys.exit(f"unknown configuration {name!r}; known: {', '.join(CONFIG_NAMES)}")
        method, config = configs[name]
        for concurrency in args.concurrencies.split(","):
            command = [args.binary, "bench", "throughput", "--model", args.model, "--load-format", args.load_format,
                       "--device", args.device, "--input-len", str(args.input_len),
                       "--output-len", str(args.output_len), "--concurrency", concurrency,
                       "--num-prompts", str(args.requests_per_slot * int(concurrency)), "--seed", str(args.seed),
                       "--sparse-method", method, "--sparse-config", json.dumps(config), "--csv", args.csv,
                       *args.extra]
            print("$", " ".join(command), flush=True)
            failures += subprocess.run(command).returncode != 0
    return failures


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def admission(row: dict) -> str:
    """The row's admission policy (`--admission`); rows written before the column existed ran optimistic."""
    return row.get("admission") or "optimistic"


def report(paths: list[str]) -> None:
    rows = [row for path in paths for row in read_rows(path)]
    print("| concurrency | method | admission | output tok/s | elapsed s | preemptions | peak KV pages / pool | "
          "pages freed by compression | compression steps | compression share |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    order = {name: i for i, name in enumerate(CONFIG_NAMES)}
    for r in sorted(rows, key=lambda r: (int(r["concurrency"]), order.get(config_name(r), 99), admission(r))):
        print(f"| {r['concurrency']} | {config_name(r)} | {admission(r)} | {float(r['output_tok_s']):.1f} | "
              f"{float(r['elapsed_s']):.1f} | {r['preemptions']} | {r['kv_pages_peak']} / {r['kv_pages_total']} | "
              f"{r['compression_freed_pages']} | {r['compression_steps']} | "
              f"{100 * float(r['compression_share']):.1f}% |")
    # The ratios compare configurations under one admission policy at a time.
    for policy in sorted({admission(r) for r in rows}):
        tok_s = {(config_name(r), int(r["concurrency"])): float(r["output_tok_s"])
                 for r in rows if admission(r) == policy}
        concurrencies = sorted({c for _, c in tok_s})
        print(f"\nadmission {policy}:\n\n| concurrency | kara / snapkv-threshold | kara / rkv | kara / vanilla |")
        print("|---|---|---|---|")
        for c in concurrencies:
            kara = tok_s.get(("kara", c))
            print(f"| {c} | {ratio(kara, tok_s.get(('snapkv-threshold', c)))} | "
                  f"{ratio(kara, tok_s.get(('rkv', c)))} | {ratio(kara, tok_s.get(('vanilla', c)))} |")
        kara_curve = [tok_s[("kara", c)] for c in concurrencies if ("kara", c) in tok_s]
        dense_curve = [tok_s[("vanilla", c)] for c in concurrencies if ("vanilla", c) in tok_s]
        if len(kara_curve) > 1:
            rising = all(b > a for a, b in zip(kara_curve, kara_curve[1:]))
            print(f"\nkara's throughput rises with every step of concurrency: {'yes' if rising else 'no'}")
        if kara_curve and dense_curve:
            print(f"kara's best over dense's best at the same memory: {max(kara_curve) / max(dense_curve):.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", default="build/sparse-engine")
    parser.add_argument("--model", default="bench/models/llama-3.1-8b")
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=16384)
    parser.add_argument("--budget", type=int, default=2048, help="generated tokens kept per (layer, KV head)")
    parser.add_argument("--concurrencies", default="8,16,32,64,128")
    parser.add_argument("--requests-per-slot", type=int, default=2, help="requests = this x concurrency")
    parser.add_argument("--methods", default=",".join(CONFIG_NAMES))
    parser.add_argument("--method-config", metavar="NAME=JSON", action="append", default=[],
                        help="settings merged into a configuration's sparse config")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", default="bench/results/long_generation.csv")
    parser.add_argument("--report", metavar="CSV", nargs="+", help="only print the tables of these CSVs")
    parser.add_argument("extra", nargs="*", help="more `bench throughput` flags (the KV pool), after --")
    args = parser.parse_args()
    if args.report:
        report(args.report)
        return 0
    Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
    failures = run_sweep(args)
    report([args.csv])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
