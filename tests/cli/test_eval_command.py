"""End-to-end test of `sparse-engine eval` at small sizes on the default model: vanilla against vanilla agrees on
every step with a KL of exactly 0, every registered method runs at a budget without error, the report is written
with the command line that produced it, and bad options are usage errors."""
import json
import re
import subprocess

import pytest

from server_process import BINARY, require_default_model

TEXT = "/usr/share/common-licenses/GPL-3"
CONTEXT, CONTINUATION, PASSKEY = 192, 3, 160


def eval_args(output, *extra):
    return [str(BINARY), "eval", "--models", "default", "--texts", TEXT, "--context", str(CONTEXT),
            "--continuation", str(CONTINUATION), "--passkey-lengths", str(PASSKEY), "--passkey-depths", "0.5",
            "--passkey-answer-tokens", "7", "--budgets", "0.5", "--prefill-chunk", "96", "--output", str(output),
            *extra]


def table_rows(markdown):
    """{(method, budget): [cells]} of the report's table."""
    rows = {}
    for line in markdown.splitlines():
        if not line.startswith("| ") or line.startswith("| method") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[(cells[0], cells[1])] = cells
    return rows


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    require_default_model()
    output = tmp_path_factory.mktemp("eval") / "quality.md"
    r = subprocess.run(eval_args(output), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return output.read_text(), r


def test_vanilla_against_itself_is_exact(report):
    markdown, _ = report
    rows = table_rows(markdown)
    vanilla = rows[("vanilla", "—")]
    # method | budget | config | agreement | KL | KV held | passkey | time
    assert vanilla[3] == "100.0%", vanilla
    assert vanilla[4] == "0.0000", vanilla
    assert vanilla[5] == "100.0%", vanilla
    assert vanilla[6] == "1/1", vanilla  # a short passkey prompt is easy for the dense model


def test_every_method_runs(report):
    markdown, run = report
    rows = table_rows(markdown)
    listed = subprocess.run([str(BINARY), "methods", "--json"], capture_output=True, text=True, timeout=60)
    for m in json.loads(listed.stdout):
        budgeted = [cells for (method, _), cells in rows.items() if method == m["name"]]
        assert budgeted, f"{m['name']} has no row"
        for cells in budgeted:
            assert not cells[3].startswith("error"), cells
            assert re.fullmatch(r"\d+\.\d%", cells[3]), cells
            assert float(cells[4]) >= 0.0, cells
            assert re.fullmatch(r"[01]/1", cells[6]), cells
            if cells[1] != "—":
                assert cells[1] == "50.0%" and cells[2].startswith("`{"), cells  # the budget key is in the config


def test_report_names_its_command_line(report):
    markdown, _ = report
    assert markdown.startswith("# ")
    assert "eval --models default --texts " + TEXT in markdown
    assert f"{CONTEXT} context + {CONTINUATION} teacher-forced tokens" in markdown


@pytest.mark.parametrize("extra, message", [
    (["--methods", "no_such_method"], "unknown --sparse-method 'no_such_method'"),
    (["--budgets", "1.5"], "--budgets"),
    (["--method-config", "vanilla={bad"], "--method-config"),
    (["--method-config", 'vanilla={"no_such_key": 1}'], "no_such_key"),
    (["--budget-key", "budget=lots"], "--budget-key"),
])
def test_bad_options_are_usage_errors(tmp_path, extra, message):
    r = subprocess.run(eval_args(tmp_path / "x.md", *extra), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr, r.stderr
    assert not (tmp_path / "x.md").exists()
