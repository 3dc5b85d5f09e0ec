"""What the name checks (check_method_names.py, check_arch_names.py) share: the whole-word pattern a name is
matched with, and the command line that prints each violation and fails when there is one."""
import pathlib
import re
import sys
from typing import Callable


def whole_word_pattern(names: list[str], not_followed_by: str = "") -> re.Pattern:
    """Any of `names` as a whole word (letters, digits and _ bound it), case-insensitively; group 1 is the name."""
    alternatives = "|".join(map(re.escape, names))
    return re.compile(rf"(?<![A-Za-z0-9_])({alternatives})(?![A-Za-z0-9_]){not_followed_by}", re.IGNORECASE)


def run(violations: Callable[[pathlib.Path], list[str]], summary: str) -> int:
    """Checks the repository named by argv[1] (default: this script's), prints each violation and then
    `summary` with their count; 1 when there was any."""
    root = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent
    found = violations(root)
    for v in found:
        print(v)
    if found:
        print(f"{len(found)} {summary}", file=sys.stderr)
        return 1
    return 0
