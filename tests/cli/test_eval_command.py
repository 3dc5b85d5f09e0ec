"""End-to-end test of `sparse-engine eval` at small sizes on the default model: vanilla against vanilla agrees on
every step with a KL of exactly 0, every registered method runs at a budget without error, the report is written
with the command line that produced it, a rerun takes every cell from the results file, and bad options are usage
errors."""
import json
import re
import subprocess

import pytest

from server_process import BINARY, require_default_model

TEXT = "/usr/share/common-licenses/GPL-3"
CONTEXT, CONTINUATION, PASSKEY = 192, 3, 160


def eval_args(output, *extra):
    return [str(BINARY), "eval", "--models", "default", "--texts", TEXT, "--windows", "1", "--context",
            str(CONTEXT), "--continuation", str(CONTINUATION), "--tasks", "niah_single", "--task-lengths", "256",
            "--samples", "1", "--passkey-lengths", str(PASSKEY), "--passkey-depths", "0.5",
            "--passkey-answer-tokens", "7", "--budgets", "0.5", "--prefill-chunk", "96", "--output", str(output),
            *extra]


def table_rows(markdown, first_header):
    """{(method, budget): [cells]} of the report's table whose header starts with `first_header`."""
    rows, inside = {}, False
    for line in markdown.splitlines():
        if line.startswith(first_header):
            inside = True
            continue
        if not line.startswith("|"):
            inside = False
        if not inside or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[(cells[0], cells[1])] = cells
    return rows


def text_rows(markdown):
    return table_rows(markdown, "| method | budget | config")


def task_rows(markdown):
    return table_rows(markdown, "| method | budget | niah_single")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    require_default_model()
    tmp = tmp_path_factory.mktemp("eval")
    output, results = tmp / "quality.md", tmp / "results.jsonl"
    r = subprocess.run(eval_args(output, "--results", str(results)), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return output.read_text(), r, results


def test_vanilla_against_itself_is_exact(report):
    markdown, _, _ = report
    vanilla = text_rows(markdown)[("vanilla", "—")]
    # method | budget | config | agreement | KL | KV held | windows | s/window
    assert vanilla[3] == "100.0% [100.0, 100.0]", vanilla
    assert vanilla[4] == "0.0000 [0.0000, 0.0000]", vanilla
    assert vanilla[5] == "100.0%", vanilla
    assert vanilla[6] == "1", vanilla
    # method | budget | niah_single 256 | passkey 160: short prompts are easy for the dense model
    assert task_rows(markdown)[("vanilla", "—")][3].startswith("1/1 = 100.0%"), markdown


def test_every_method_runs(report):
    markdown, run, _ = report
    rows, tasks = text_rows(markdown), task_rows(markdown)
    listed = subprocess.run([str(BINARY), "methods", "--json"], capture_output=True, text=True, timeout=60)
    for m in json.loads(listed.stdout):
        budgeted = [(key, cells) for key, cells in rows.items() if key[0] == m["name"]]
        assert budgeted, f"{m['name']} has no row"
        for key, cells in budgeted:
            assert not cells[3].startswith("error"), cells
            assert re.fullmatch(r"\d+\.\d% \[\d+\.\d, \d+\.\d\]", cells[3]), cells
            assert float(cells[4].split()[0]) >= 0.0, cells
            for answer in tasks[key][2:]:
                assert re.match(r"[01]/1 = ", answer), tasks[key]
            if cells[1] != "—":
                assert cells[1] == "50.0%" and cells[2].startswith("`{"), cells  # the budget key is in the config


def test_report_names_its_command_line(report):
    markdown, _, _ = report
    assert markdown.startswith("# ")
    assert "eval --models default --texts " + TEXT in markdown
    assert f"1 window(s) of {CONTEXT} context + {CONTINUATION} teacher-forced tokens" in markdown


def test_rerun_takes_every_cell_from_the_results_file(report, tmp_path):
    markdown, _, results = report
    lines = results.read_text().splitlines()
    assert lines and all(json.loads(line)["cell"]["model"].startswith("default") for line in lines)
    output = tmp_path / "again.md"
    r = subprocess.run(eval_args(output, "--results", str(results)), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    again = output.read_text()
    assert f"Cells computed now: 0, taken from the results file: {len(lines)}." in again
    assert text_rows(again) == text_rows(markdown)
    assert task_rows(again) == task_rows(markdown)
    assert len(results.read_text().splitlines()) == len(lines)


def test_report_only_renders_the_file_alone(report, tmp_path):
    """--report-only computes nothing: its windows come from the file (the text it names need not exist here, as on
    another machine), and a cell the file lacks is left out and counted."""
    markdown, _, results = report
    records = [json.loads(line) for line in results.read_text().splitlines()]
    for r in records:
        if r["cell"]["task"] == "text":
            r["cell"]["settings"]["text"] = "/no/such/text"
    dropped = next(r for r in records if r["cell"]["task"] == "niah_single" and r["cell"]["method"] == "vanilla")
    kept = [r for r in records if r is not dropped]
    partial = tmp_path / "partial.jsonl"
    partial.write_text("".join(json.dumps(r) + "\n" for r in kept))
    output = tmp_path / "report.md"
    r = subprocess.run(eval_args(output, "--results", str(partial), "--report-only"), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    rendered = output.read_text()
    assert f"Cells computed now: 0, taken from the results file: {len(kept)}." in rendered
    assert "left out of this report: 1 " in rendered
    assert text_rows(rendered) == text_rows(markdown)
    assert task_rows(rendered)[("vanilla", "—")][2] == "—"
    assert task_rows(rendered)[("vanilla", "—")][3] == task_rows(markdown)[("vanilla", "—")][3]
    r = subprocess.run(eval_args(output, "--results", str(partial), "--report-only", "--no-tasks"),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "Tasks: none." in output.read_text()
    assert len(partial.read_text().splitlines()) == len(kept)


def test_report_only_needs_a_results_file(tmp_path):
    r = subprocess.run(eval_args(tmp_path / "x.md", "--report-only"), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "--report-only needs --results" in r.stderr, r.stderr


@pytest.mark.parametrize("extra, message", [
    (["--methods", "no_such_method"], "unknown --sparse-method 'no_such_method'"),
    (["--budgets", "1.5"], "--budgets"),
    (["--method-config", "vanilla={bad"], "--method-config"),
    (["--method-config", 'vanilla={"no_such_key": 1}'], "no_such_key"),
    (["--budget-key", "budget=lots"], "--budget-key"),
    (["--tasks", "niah"], "unknown task 'niah'"),
    (["--task-depths", "1.5"], "--task-depths"),
    (["--device", "tpu"], "--device"),
    (["--self-generated", "--no-text"], "--self-generated writes"),
    (["--generation-temperature", "0.7"], "--generation-temperature needs --self-generated"),
    (["--self-generated", "--generation-temperature", "-1"], "--generation-temperature -1"),
    (["--trace-lengths", "0"], "--trace-lengths: 0"),
    (["--budget-key", "kara:=window"], "--budget-key"),
    (["--budget-key", "budget=share"], "--budget-key"),
    # A share of the window of a method that has none, or of a window that is not a count of tokens.
    (["--methods", "h2o", "--budget-key", "h2o:budget=window"], "h2o: a budget as a share of its window"),
    (["--methods", "kara", "--method-config", 'kara={"window": "wide"}'], 'kara: a budget as a share of its window'),
])
def test_bad_options_are_usage_errors(tmp_path, extra, message):
    r = subprocess.run(eval_args(tmp_path / "x.md", *extra), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr, r.stderr
    assert not (tmp_path / "x.md").exists()


def test_rows_per_store_and_the_store_in_each_cell(tmp_path):
    """--kv-cache-dtype: a row per (method, budget, store) the method can keep its KV in, labelled with the store;
    a method the store refuses is left out with the reason; every cell names its store."""
    require_default_model()
    output, results = tmp_path / "stores.md", tmp_path / "results.jsonl"
    r = subprocess.run(eval_args(output, "--results", str(results), "--methods", "vanilla,snapkv,quest",
                                 "--kv-cache-dtype", "auto,kivi2,turboquant_3.5", "--no-passkey"),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    markdown = output.read_text()
    rows = text_rows(markdown)
    assert set(rows) == {("vanilla", "—"), ("vanilla (kivi2)", "—"), ("vanilla (turboquant_3.5)", "—"),
                         ("snapkv", "50.0%"), ("snapkv (kivi2)", "50.0%"), ("snapkv (turboquant_3.5)", "50.0%"),
                         ("quest", "50.0%"), ("quest (kivi2)", "50.0%")}, rows
    for cells in rows.values():
        assert re.fullmatch(r"\d+\.\d% \[\d+\.\d, \d+\.\d\]", cells[3]), cells
    assert set(task_rows(markdown)) == set(rows)
    assert "Left out" in markdown and "quest" in markdown.split("Left out")[1] and "quest" in r.stderr
    stores = {(c["method"], c["kv_cache_dtype"]) for c in (json.loads(line)["cell"]
                                                          for line in results.read_text().splitlines())}
    assert stores == {("vanilla", "auto"), ("vanilla", "kivi2"), ("vanilla", "turboquant_3.5"), ("snapkv", "auto"),
                      ("snapkv", "kivi2"), ("snapkv", "turboquant_3.5"), ("quest", "auto"), ("quest", "kivi2")}


def test_an_unknown_store_is_a_usage_error(tmp_path):
    r = subprocess.run(eval_args(tmp_path / "x.md", "--kv-cache-dtype", "auto,int3"), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, r.stderr
    assert "--kv-cache-dtype must be auto" in r.stderr, r.stderr


def test_self_generated_continuation_and_kv_trace(tmp_path):
    """--self-generated: vanilla replaying the continuation it wrote agrees on every step with a KL of 0; budgets are
    fractions of context + continuation (Kara's of its window); the cells say so; kv_trace gets a column."""
    require_default_model()
    output, results = tmp_path / "self.md", tmp_path / "results.jsonl"
    context, continuation = 64, 24
    args = [str(BINARY), "eval", "--models", "default", "--texts", TEXT, "--windows", "1", "--context", str(context),
            "--continuation", str(continuation), "--self-generated", "--generation-temperature", "0.8",
            "--methods", "vanilla,streamingllm,kara", "--budgets", "0.5", "--no-tasks", "--no-passkey",
            "--trace-lengths", "48", "--samples", "1", "--results", str(results), "--output", str(output)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    markdown = output.read_text()
    rows = text_rows(markdown)
    assert rows[("vanilla", "—")][3:6] == ["100.0% [100.0, 100.0]", "0.0000 [0.0000, 0.0000]", "100.0%"], rows
    assert rows[("streamingllm", "50.0%")][2] == '`{"budget":44}`', rows  # half of 64 + 24
    assert rows[("kara", "50.0%")][2] == '`{"budget":256}`', rows  # half of its window of 512
    assert f"{continuation} tokens vanilla wrote (sampled at temperature 0.8, seeded), replayed" in markdown
    trace = table_rows(markdown, "| method | budget | kv_trace 48")
    assert set(trace) == set(rows) and all(re.match(r"[01]/1 = ", cells[2]) for cells in trace.values()), trace
    cells = [json.loads(line)["cell"] for line in results.read_text().splitlines()]
    text_cells = [c for c in cells if c["task"] == "text"]
    assert len(text_cells) == 3 and all(c["settings"]["self_generated"] for c in text_cells), text_cells
    assert len([c for c in cells if c["task"] == "kv_trace"]) == 3
    # The same sampled continuation again: every cell is in the file.
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "Cells computed now: 0, taken from the results file: 6." in output.read_text()
