"""Where a decode step's GPU time goes: the per-kernel durations `ncu` measured for a `bench decode` run (eager,
so every kernel is its own launch), split into forwards at each embedding kernel; the last --steps forwards are
decode steps. Prints the kernels grouped by name with their time per step and share, and the sum of kernel time
per step (what a gap-free step would take; the measured step time minus this is launch and host overhead).

usage: profile_decode.py NCU_CSV [--steps N]
"""
import argparse
import collections
import csv
import io
import re


def read_kernels(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    start = text.find('"ID"')
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    kernels = []
    for row in rows:
        value = row.get("gpu__time_duration.sum", "")
        try:
            kernels.append((row["Kernel Name"], float(value.replace(",", ""))))
        except ValueError:
            continue  # the units row
    return kernels


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("csv")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    kernels = read_kernels(args.csv)
    # A step starts at the token embedding after the previous step's sampling; the gather of the logit rows
    # before the final norm runs the embedding kernel too and stays inside its step.
    forwards, current = [], []
    for name, ns in kernels:
        if "embedding" in name and current and re.search(r"argmax|sample_rows", current[-1][0]):
            forwards.append(current)
            current = []
        current.append((name, ns))
    forwards.append(current)
    # Whole decode forwards only: the capture opens and closes mid-step.
    longest = max(len(f) for f in forwards)
    steps = [f for f in forwards if len(f) == longest][-args.steps:]
    by_name = collections.defaultdict(lambda: [0.0, 0])
    for step in steps:
        for name, ns in step:
            short = re.sub(r"<unnamed>::|\(anonymous namespace\)::|^void ", "", name)
            short = short.split("(")[0].split("<")[0].strip()
            by_name[short][0] += ns / len(steps)
            by_name[short][1] += 1
    total = sum(t for t, _ in by_name.values())
    print(f"{len(kernels)} kernels profiled, {len(forwards)} forwards; the last {len(steps)} are averaged")
    print(f"| kernel | launches per step | us per step | share |\n|---|---|---|---|")
    for short, (ns, count) in sorted(by_name.items(), key=lambda kv: -kv[1][0]):
        print(f"| {short} | {count // len(steps)} | {ns / 1e3:.1f} | {100 * ns / total:.1f}% |")
    print(f"| **sum of kernel time** | {sum(c for _, c in by_name.values()) // len(steps)} | {total / 1e3:.1f} | |")


if __name__ == "__main__":
    main()
