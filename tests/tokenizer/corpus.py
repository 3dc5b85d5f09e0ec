"""The tokenizer comparison corpus, built deterministically at test time.

Entries are cut from text files every Debian 12 machine with this repository's dependencies has
(license texts, package copyright files and READMEs, headers of the libraries we build against),
plus our own multilingual / emoji / whitespace lines in fixtures/extra_lines.jsonl. Entries span
one to several lines (so newlines, indentation and trailing whitespace appear inside them), and
every few entries get a special-token string inserted.
"""
import glob
import gzip
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))

# (glob pattern, lines taken per file); files are visited in sorted order.
SYSTEM_SOURCES = [
    ("/usr/share/common-licenses/*", 500),
    ("/usr/include/pcre2.h", 1200),
    ("/usr/include/utf8proc.h", 800),
    ("/usr/include/nlohmann/json.hpp", 1500),
    ("/usr/include/fmt/core.h", 800),
    ("/usr/include/gtest/gtest.h", 800),
    ("/usr/share/doc/*/README*", 40),
    ("/usr/share/doc/*/copyright", 40),
]

SPECIAL_STRINGS = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<start_of_turn>", "<end_of_turn>", "<bos>",
    "<eos>", "<b>", "</s>", "[multimodal]", "<|im_start|>user\n", "<repo_name>", "<unused3>",
    "\n<end_of_turn>\n",
]

CHUNK_SIZES = [1, 2, 1, 3, 1, 1, 5, 2, 1, 4]


def _read_text(path):
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data.decode("utf-8", errors="replace")


def _system_files():
    seen = set()
    for pattern, max_lines in SYSTEM_SOURCES:
        for path in sorted(glob.glob(pattern)):
            real = os.path.realpath(path)
            if real in seen or not os.path.isfile(real):
                continue
            seen.add(real)
            yield path, max_lines


def extra_lines():
    with open(os.path.join(HERE, "fixtures", "extra_lines.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def build_corpus(max_entries=13000):
    """Returns (entries, sources): a list of strings and the files they came from."""
    entries = list(extra_lines())
    sources = []
    counter = 0
    for path, max_lines in _system_files():
        text = _read_text(path)
        if not text:
            continue
        sources.append(path)
        lines = text.splitlines(keepends=True)[:max_lines]
        i = 0
        while i < len(lines) and len(entries) < max_entries:
            size = CHUNK_SIZES[counter % len(CHUNK_SIZES)]
            entry = "".join(lines[i:i + size])
            i += size
            counter += 1
            if counter % 2 == 0 and entry.endswith("\n"):
                entry = entry[:-1]
            if counter % 11 == 0:
                special = SPECIAL_STRINGS[(counter // 11) % len(SPECIAL_STRINGS)]
                at = len(entry) // 2
                entry = entry[:at] + special + entry[at:]
            entries.append(entry)
        if len(entries) >= max_entries:
            break
    return entries, sources
