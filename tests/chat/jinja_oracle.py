"""The reference renderer: Python jinja2 exactly as HF transformers configures it for chat templates.

Uses transformers' own environment factory (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, its tojson / raise_exception / strftime_now / dict / namespace) so the oracle cannot
drift from what apply_chat_template renders. strftime_now reads a pinned clock.
"""

import contextlib
import copy
import datetime
import importlib


def _chat_template_utils():
    return importlib.import_module("transformers.utils.chat_template_utils")


class _FixedDatetime(datetime.datetime):
    fixed = None

    @classmethod
    def now(cls, tz=None):
        return cls.fixed


@contextlib.contextmanager
def pinned_now(when):
    """Makes transformers' strftime_now() report `when` (a naive datetime) inside the block."""
    utils = _chat_template_utils()
    saved = utils.datetime
    _FixedDatetime.fixed = when
    utils.datetime = _FixedDatetime
    try:
        yield
    finally:
        utils.datetime = saved


_ENVIRONMENT = None


def environment():
    """transformers' chat-template Environment (built once; it compiles any template source)."""
    global _ENVIRONMENT
    if _ENVIRONMENT is None:
        _ENVIRONMENT = _chat_template_utils()._compile_jinja_template("").environment
    return _ENVIRONMENT


def render_snippet(source, variables):
    """Renders a template with transformers' environment; returns ("ok", text) or ("error", exc)."""
    try:
        template = environment().from_string(source)
        # A deep copy: some jinja2 filters mutate their input (|indent does `s += "\n"` on lists).
        return "ok", template.render(**copy.deepcopy(variables))
    except Exception as e:  # noqa: BLE001 - every jinja2 failure is a test outcome
        return "error", e


def render_chat(source, messages, tools=None, add_generation_prompt=False, **kwargs):
    """transformers.render_jinja_template: the prompt apply_chat_template(tokenize=False) builds."""
    utils = _chat_template_utils()
    rendered, _ = utils.render_jinja_template(
        conversations=[messages],
        tools=tools,
        chat_template=source,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )
    return rendered[0]
