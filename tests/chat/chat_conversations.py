"""Conversations the chat-template tests render with each model template.

conversations(family) yields (case_id, messages, tools, extra) where `extra` holds the keyword
variables passed to the template (add_generation_prompt, enable_thinking, date_string, ...).
The sets are deterministic and cover: with/without system prompt, 1-6 turns, generation prompt on
and off, unicode and template-like text in content, empty content, tools, tool calls and tool
results, enable_thinking and reasoning_content, and the templates' own error paths.
"""

SYSTEMS = [None, "You are a helpful assistant.", "  Système : réponds brièvement. 🇫🇷\n", ""]
USER_TEXTS = [
    "Hello!",
    "What's 2+2?",
    "日本語で答えて。😀",
    "Special: {{ x }} {% if %} <|im_end|> <end_of_turn> \\ \" ' \u2028",
    "",
    "  padded  \n",
    "line1\nline2\n\n\tline4",
]
ASSISTANT_TEXTS = ["Hi there!", "4", "Sure — voilà: «ok».", "", "Multi\nline\nanswer "]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web — returns snippets.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "filters": {"type": "array", "items": {"type": "string"}}},
                "required": ["query"],
            },
        },
    },
]


def chat(system, num_turns, end_with_assistant=False, offset=0):
    """A user/assistant conversation of `num_turns` user messages."""
    messages = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    for turn in range(num_turns):
        messages.append({"role": "user", "content": USER_TEXTS[(turn + offset) % len(USER_TEXTS)]})
        if turn < num_turns - 1 or end_with_assistant:
            messages.append({"role": "assistant", "content": ASSISTANT_TEXTS[(turn + offset) % len(ASSISTANT_TEXTS)]})
    return messages


def basic_grid(family):
    for s_index, system in enumerate(SYSTEMS):
        for turns in range(1, 7):
            for agp in (True, False):
                yield (f"{family}-sys{s_index}-t{turns}-agp{int(agp)}", chat(system, turns, offset=s_index + turns),
                       None, {"add_generation_prompt": agp})
        yield (f"{family}-sys{s_index}-ends-assistant", chat(system, 2, end_with_assistant=True, offset=s_index),
               None, {"add_generation_prompt": False})


def tool_call(name, arguments, as_string=False):
    import json
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments) if as_string else arguments}}


def smollm2_conversations():
    yield from basic_grid("smollm2")
    yield ("smollm2-empty", [], None, {"add_generation_prompt": True})


def gemma3_conversations():
    yield from basic_grid("gemma3")
    parts = [{"type": "text", "text": "  Look at this: "}, {"type": "image"}, {"type": "text", "text": "What is it? "}]
    yield ("gemma3-content-parts", [{"role": "system", "content": [{"type": "text", "text": "Sys as parts"}]},
                                    {"role": "user", "content": parts}], None, {"add_generation_prompt": True})
    yield ("gemma3-parts-multi-turn", [{"role": "user", "content": parts},
                                       {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
                                       {"role": "user", "content": "Thanks"}], None, {"add_generation_prompt": False})
    yield ("gemma3-roles-not-alternating", [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
           None, {"add_generation_prompt": True})
    yield ("gemma3-starts-with-assistant", [{"role": "assistant", "content": "a"}], None, {})
    yield ("gemma3-invalid-content", [{"role": "user", "content": 42}], None, {})


def qwen3_conversations():
    yield from basic_grid("qwen3")
    for thinking in (None, True, False):
        extra = {} if thinking is None else {"enable_thinking": thinking}
        for agp in (True, False):
            yield (f"qwen3-thinking{thinking}-agp{int(agp)}", chat("Be terse.", 2), None,
                   {"add_generation_prompt": agp, **extra})
    yield ("qwen3-think-tags-last", chat(None, 1) + [{"role": "assistant", "content": "<think>\nLet me think.\n</think>\n\nThe answer."}],
           None, {})
    yield ("qwen3-think-tags-history",
           [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "<think>r1</think>a1"},
            {"role": "user", "content": "q2"}, {"role": "assistant", "content": "<think>\nr2\n</think>\n\na2"}],
           None, {"add_generation_prompt": False})
    yield ("qwen3-reasoning-content",
           [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
            {"role": "user", "content": "q2"}, {"role": "assistant", "content": "\n\na2", "reasoning_content": "\nr2\n"}],
           None, {"enable_thinking": True})
    yield ("qwen3-reasoning-alias", [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning": "why"}],
           None, {})
    for s_index, system in enumerate([None, "You can call tools."]):
        yield (f"qwen3-tools-sys{s_index}", chat(system, 1), TOOLS, {"add_generation_prompt": True})
    call_turn = [
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Paris and Tokyo?"},
        {"role": "assistant", "content": "", "tool_calls": [tool_call("get_weather", {"city": "Paris", "days": 2}),
                                                             tool_call("get_weather", {"city": "東京", "unit": "celsius"}, as_string=True)]},
        {"role": "tool", "content": "{\"temp\": 21.5}"},
        {"role": "tool", "content": "{\"temp\": 18}"},
    ]
    yield ("qwen3-tool-calls-pending", call_turn, TOOLS, {"add_generation_prompt": True})
    final = call_turn + [{"role": "assistant", "content": "Paris 21.5°C, Tokyo 18°C.", "reasoning_content": "Combine results."}]
    yield ("qwen3-tool-calls-final", final, TOOLS, {"add_generation_prompt": False})
    follow_up = final + [{"role": "user", "content": "And tomorrow?"}]
    for thinking in (True, False):
        yield (f"qwen3-multi-step-thinking{thinking}", follow_up, TOOLS, {"add_generation_prompt": True, "enable_thinking": thinking})
    yield ("qwen3-tool-call-with-content",
           [{"role": "user", "content": "Search cats"},
            {"role": "assistant", "content": "Let me search.", "tool_calls": [{"function": {"name": "search", "arguments": {"query": "cats", "filters": []}}}]},
            {"role": "tool", "content": "Cats are mammals."},
            {"role": "user", "content": "<tool_response>\nextra\n</tool_response>"}],
           TOOLS, {"add_generation_prompt": True})


def llama3_conversations(family, builtin_tools=False):
    yield from basic_grid(family)
    user_first = [{"role": "system", "content": "Answer with tools."}, {"role": "user", "content": "  Weather in Paris?  "}]
    yield (f"{family}-tools", user_first, TOOLS, {"add_generation_prompt": True})
    yield (f"{family}-tools-no-system", user_first[1:], TOOLS, {"add_generation_prompt": True})
    yield (f"{family}-tools-in-system", user_first, TOOLS, {"add_generation_prompt": True, "tools_in_user_message": False})
    called = user_first + [{"role": "assistant", "tool_calls": [tool_call("get_weather", {"city": "Paris", "days": 3})]}]
    yield (f"{family}-tool-call", called, TOOLS, {"add_generation_prompt": False})
    for name, result in (("string", "21 degrees"), ("dict", {"temp": 21.5, "sky": "clear"}), ("list", [1, "two"])):
        yield (f"{family}-tool-result-{name}", called + [{"role": "tool", "content": result}], TOOLS,
               {"add_generation_prompt": True})
    yield (f"{family}-ipython-role", called + [{"role": "ipython", "content": "ok"},
                                               {"role": "assistant", "content": "It is 21 degrees."},
                                               {"role": "user", "content": "Thanks!"}], TOOLS,
           {"add_generation_prompt": True})
    two_calls = user_first + [{"role": "assistant", "tool_calls": [tool_call("get_weather", {"city": "Paris"}),
                                                                    tool_call("search", {"query": "x"})]}]
    yield (f"{family}-two-tool-calls", two_calls, TOOLS, {})
    yield (f"{family}-tools-without-user", [{"role": "system", "content": "Only system."}], TOOLS, {})
    yield (f"{family}-date-string", chat("Sys", 1), None, {"add_generation_prompt": True, "date_string": "01 Jan 2030"})
    if builtin_tools:
        extra = {"builtin_tools": ["brave_search", "wolfram_alpha", "code_interpreter"]}
        yield (f"{family}-builtin-tools", user_first, None, {"add_generation_prompt": True, **extra})
        search = user_first + [{"role": "assistant", "tool_calls": [tool_call("brave_search", {"query": "Paris weather"})]},
                               {"role": "ipython", "content": "Sunny."}]
        yield (f"{family}-builtin-tool-call", search, TOOLS, {"add_generation_prompt": True, **extra})


# family -> (template file, bos_token, eos_token, conversations)
TEMPLATES = {
    "smollm2": ("HuggingFaceTB-SmolLM2-135M-Instruct.jinja", "<|im_start|>", "<|im_end|>", smollm2_conversations),
    "gemma3": ("google-gemma-3-4b-it.jinja", "<bos>", "<eos>", gemma3_conversations),
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", None, "<|im_end|>", qwen3_conversations),
    "llama3.2": ("meta-llama-Llama-3.2-3B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>",
                 lambda: llama3_conversations("llama3.2")),
    "llama3.3": ("meta-llama-Llama-3.3-70B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>",
                 lambda: llama3_conversations("llama3.3", builtin_tools=True)),
}
