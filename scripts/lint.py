#!/usr/bin/env python3
"""Fails on new style violations: lines changed since BASE that clang-format would rewrite (.clang-format) or that
clang-tidy warns about (.clang-tidy). Older code is left as it is; only what a change adds must be clean.

usage: scripts/lint.py [BASE]      BASE defaults to the commit named in .ci/lint-base
Needs clang-format, git-clang-format and clang-tidy in .venv (python/requirements.txt) and, for clang-tidy, the
build's compile_commands.json (scripts/build.sh writes it).
"""
import concurrent.futures
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / ".venv" / "bin"
SOURCES = ("src/", "tests/", "bench/")
FORMATTED = (".cpp", ".h", ".cu", ".cuh")
WARNING = re.compile(r"^(?P<file>/[^:]+):(?P<line>\d+):\d+: warning: (?P<text>.*)$")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def changed_lines(base: str) -> dict[str, set[int]]:
    """Per changed source file (repo-relative), the line numbers its current version adds or modifies."""
    lines: dict[str, set[int]] = {}
    current = None
    for row in git("diff", "-U0", "--diff-filter=ACMR", base, "--", *SOURCES).splitlines():
        if row.startswith("+++ "):
            path = row[6:] if row.startswith("+++ b/") else None
            current = path if path and path.endswith(FORMATTED) else None
            if current:
                lines.setdefault(current, set())
        elif row.startswith("@@") and current:
            added = row.split(" ")[2]  # +start[,count]
            start, _, count = added[1:].partition(",")
            n = int(count) if count else 1
            lines[current].update(range(int(start), int(start) + n))
    return {f: l for f, l in lines.items() if l}


def format_violations(base: str, files: list[str]) -> str:
    result = subprocess.run(
        [str(TOOLS / "git-clang-format"), "--binary", str(TOOLS / "clang-format"), "--diff", base, "--", *files],
        cwd=ROOT, capture_output=True, text=True)
    out = result.stdout.strip()
    if result.returncode not in (0, 1) or "error" in result.stderr.lower():
        sys.exit(f"git-clang-format failed: {result.stderr.strip()}")
    return "" if out in ("", "no modified files to format", "clang-format did not modify any files") else out


def tidy_warnings(files: list[str], lines: dict[str, set[int]]) -> list[str]:
    database = ROOT / "build" / "compile_commands.json"
    if not database.exists():
        sys.exit("lint: build/compile_commands.json is missing; run scripts/build.sh first")
    compiled = {os.path.realpath(e["file"]) for e in json.loads(database.read_text())}
    units = [f for f in files if f.endswith(".cpp") and os.path.realpath(ROOT / f) in compiled]

    def run(unit: str) -> str:
        return subprocess.run([str(TOOLS / "clang-tidy"), "-p", str(ROOT / "build"), "--quiet", str(ROOT / unit)],
                              cwd=ROOT, capture_output=True, text=True).stdout

    found = set()
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for output in pool.map(run, units):
            for row in output.splitlines():
                m = WARNING.match(row)
                if not m:
                    continue
                path = os.path.relpath(m["file"], ROOT)
                if int(m["line"]) in lines.get(path, ()):
                    found.add(f"{path}:{m['line']}: {m['text']}")
    return sorted(found)


def main() -> int:
    base = sys.argv[1] if len(sys.argv) > 1 else (ROOT / ".ci" / "lint-base").read_text().split()[0]
    lines = changed_lines(base)
    files = sorted(lines)
    print(f"lint: {len(files)} source files changed since {base[:12]}")
    failed = False
    formatting = format_violations(base, files) if files else ""
    if formatting:
        print("lint: clang-format would change these lines (run .venv/bin/git-clang-format --binary "
              f".venv/bin/clang-format {base[:12]}):\n{formatting}")
        failed = True
    warnings = tidy_warnings(files, lines) if files else []
    if warnings:
        print("lint: clang-tidy warns on changed lines:\n" + "\n".join(warnings))
        failed = True
    print("lint: " + ("failed" if failed else "clean"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
