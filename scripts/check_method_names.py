#!/usr/bin/env python3
"""Fails when a sparse method's name appears in src/ outside the method's own files and the registries.

Adding a method should touch only its own files plus one registry line, so no other file may know a method by
name. The names are the registry's (src/sparse/method_registry.cpp), less the dense default `vanilla`, which the
engine names as its baseline. A name matches as a whole word, case-insensitively ("SnapKV's" does; the prune
policy `snapkv_global` and the type `SnapKvGlobalScorer` do not). Where a name may appear:
  - src/sparse/methods/: the methods themselves and the helpers they share (a method may name the one it extends);
  - a file whose name starts with `<name>_` or is `<name>.<ext>` anywhere in src/: it belongs to that method (a
    prune policy's scorer, src/sparse/prune/<name>_global_scorer.*, belongs to the method whose scores it reads);
  - the registries: src/sparse/method_registry.cpp and src/sparse/prune/prune_scorer_registry.cpp.
Usage: check_method_names.py [REPO_ROOT]   (default: this script's repository)
"""
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import name_check  # noqa: E402

REGISTRY = "src/sparse/method_registry.cpp"
REGISTRIES = {REGISTRY, "src/sparse/prune/prune_scorer_registry.cpp"}
METHODS_DIR = "src/sparse/methods/"
BASELINE = "vanilla"


def method_names(root: pathlib.Path) -> list[str]:
    text = (root / REGISTRY).read_text()
    names = re.findall(r'\{\{"([a-z0-9_]+)",', text)
    return sorted(n for n in set(names) if n != BASELINE)


def owner(path: str, names: list[str]) -> str | None:
    """The method a file belongs to by its name, if any."""
    base = path.rsplit("/", 1)[-1].lower()
    for name in names:
        if base.startswith(name + "_") or base.startswith(name + "."):
            return name
    return None


def violations(root: pathlib.Path) -> list[str]:
    names = method_names(root)
    if not names:
        return [f"{REGISTRY}: no method names found"]
    pattern = name_check.whole_word_pattern(names)
    found = []
    for file in sorted((root / "src").rglob("*")):
        if not file.is_file():
            continue
        rel = file.relative_to(root).as_posix()
        if rel in REGISTRIES or rel.startswith(METHODS_DIR):
            continue
        file_owner = owner(rel, names)
        try:
            lines = file.read_text().splitlines()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(lines, 1):
            for match in pattern.finditer(line):
                if match.group(1).lower() != file_owner:
                    found.append(f"{rel}:{number}: names method '{match.group(1).lower()}': {line.strip()}")
    return found


if __name__ == "__main__":
    sys.exit(name_check.run(violations, "mention(s) of a method outside its own files and the registries (move the fact "
                                        "into the method, or name no method)"))

