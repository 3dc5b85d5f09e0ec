#!/usr/bin/env python3
"""Fails when a model architecture's name appears in the code of src/ outside src/model/arch/.

Everything about an architecture (its config keys, GGUF metadata, weight names and transforms, its block) lives
in its own file under src/model/arch/ and its one registry entry, so no other code may dispatch on an
architecture by name. The names are the registry entries' (`.name`, `.gguf_architecture` and the `kModelTypes`
lists in src/model/arch/*.cpp), matched as whole words, case-insensitively, in code and string literals; comments
may cite a model as an example ("Gemma 3's local layers"). The project name llama.cpp is not an architecture.
Not checked: src/tokenizer/, whose vocabularies are typed by GGUF's tokenizer keys (tokenizer.ggml.model "llama",
tokenizer.ggml.pre "qwen2"), values that share names with architectures; src/server/reasoning_parser.cpp, whose
--reasoning-parser names are vLLM's (they name the model families that write each format, e.g. "qwen3").
Usage: check_arch_names.py [REPO_ROOT]   (default: this script's repository)
"""
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import name_check  # noqa: E402

ARCH_DIR = "src/model/arch/"
UNCHECKED = ("src/tokenizer/", "src/server/reasoning_parser.cpp")
SOURCE_SUFFIXES = {".h", ".cpp", ".cu", ".cuh"}


def arch_names(root: pathlib.Path) -> list[str]:
    names = set()
    for file in (root / ARCH_DIR).glob("*.cpp"):
        text = file.read_text()
        names.update(re.findall(r'\.(?:name|gguf_architecture)\s*=\s*"([A-Za-z0-9_]+)"', text))
        for types in re.findall(r"kModelTypes\s*=\s*\{([^}]*)\}", text):
            names.update(re.findall(r'"([A-Za-z0-9_]+)"', types))
    return sorted(names)


def code_of(line: str) -> str:
    """The line without its // comment (a // inside a string literal is kept)."""
    in_string = False
    for i, c in enumerate(line):
        if c == '"' and (i == 0 or line[i - 1] != "\\"):
            in_string = not in_string
        elif not in_string and line.startswith("//", i):
            return line[:i]
    return line


def violations(root: pathlib.Path) -> list[str]:
    names = arch_names(root)
    if not names:
        return [f"{ARCH_DIR}: no architecture names found"]
    pattern = name_check.whole_word_pattern(names, not_followed_by=r"(?![.\-_]cpp)")
    found = []
    for file in sorted((root / "src").rglob("*")):
        if not file.is_file() or file.suffix not in SOURCE_SUFFIXES:
            continue
        rel = file.relative_to(root).as_posix()
        if rel.startswith(ARCH_DIR) or rel.startswith(UNCHECKED):
            continue
        in_block_comment = False
        for number, line in enumerate(file.read_text().splitlines(), 1):
            stripped = line.strip()
            if in_block_comment or stripped.startswith("/*"):
                in_block_comment = "*/" not in stripped
                continue
            for match in pattern.finditer(code_of(line)):
                found.append(f"{rel}:{number}: names architecture '{match.group(1).lower()}': {stripped}")
    return found


if __name__ == "__main__":
    sys.exit(name_check.run(violations, f"mention(s) of an architecture outside {ARCH_DIR} (move the fact into "
                                        "the architecture's file, or name no architecture)"))
