"""Regenerates jinja_cases.json: the jinja2 renderings of jinja_cases.CASES.

Run with the repo's virtual environment after editing jinja_cases.py:
    .venv/bin/python tests/chat/gen_jinja_expected.py
"""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import jinja_cases  # noqa: E402
import jinja_oracle  # noqa: E402

OUT = pathlib.Path(__file__).parent / "jinja_cases.json"


def expected_for(template, variables):
    status, value = jinja_oracle.render_snippet(template, variables)
    if status == "ok":
        return {"ok": True, "output": value}
    return {"ok": False, "error_type": type(value).__name__, "message": str(value)}


def build():
    names = set()
    cases = []
    for name, template, variables in jinja_cases.CASES:
        assert name not in names, f"duplicate case name {name}"
        names.add(name)
        cases.append({"name": name, "template": template, "variables": variables,
                      "expected": expected_for(template, variables)})
    return cases


def main():
    OUT.write_text(json.dumps(build(), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
