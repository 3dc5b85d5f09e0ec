"""End-to-end tests of the agent-facing chat API with the official openai client, default model (SmolLM2-135M-
Instruct) on the CPU: tool calls (tool_choice required / named / auto / none, streamed deltas, a call -> tool
result -> answer round trip), reasoning_content, and response_format json_object / json_schema by constrained
decoding. The tiny model writes neither tool calls nor think tags on its own: required and named tool choices make
it write a call through constrained decoding, and the deepseek_r1 parser reads its whole reply as reasoning, as
that format does until </think>. Greedy decoding keeps the streamed and whole answers comparable."""
import json

import openai
import pytest
import requests

from schema_subset import validate
from server_process import SOURCE_DIR, ServerProcess

QWEN3_TEMPLATE = SOURCE_DIR / "tests" / "chat" / "templates" / "Qwen-Qwen3-0.6B.jinja"
BASE_ARGS = ("--max-model-len", "2048", "--kv-cache-memory", "128MiB")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "description": "the city"},
                                  "unit": {"enum": ["celsius", "fahrenheit"]},
                                  "days": {"type": "integer"}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}},
                                       "required": ["zone"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tool_server():
    """Qwen3's chat template (ChatML like SmolLM2's, with tools and thinking) and the hermes parser."""
    s = ServerProcess(*BASE_ARGS, "--chat-template", str(QWEN3_TEMPLATE), "--tool-call-parser", "hermes",
                      "--reasoning-parser", "qwen3")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def plain_server():
    """The model's own template (no tool support) and the deepseek_r1 reasoning parser."""
    s = ServerProcess(*BASE_ARGS, "--reasoning-parser", "deepseek_r1")
    yield s
    s.stop()


def client_of(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0, timeout=300)


def chat(server, **kwargs):
    args = dict(model="default", messages=ASK, max_tokens=60, temperature=0)
    args.update(kwargs)
    return client_of(server).chat.completions.create(**args)


def stream_chunks(server, **kwargs):
    return list(chat(server, stream=True, **kwargs))


def check_call(call, tool):
    assert call.type == "function" and call.id
    assert call.function.name == tool["function"]["name"]
    args = json.loads(call.function.arguments)
    validate(args, tool["function"]["parameters"])
    return args


def test_required_tool_choice_makes_a_valid_call(tool_server):
    r = chat(tool_server, tools=[WEATHER, TIME], tool_choice="required", max_tokens=120)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.tool_calls and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    check_call(call, WEATHER if call.function.name == "get_weather" else TIME)
    assert not choice.message.content


def test_named_tool_choice_calls_that_function(tool_server):
    for tool in (WEATHER, TIME):
        r = chat(tool_server, tools=[WEATHER, TIME], max_tokens=120,
                 tool_choice={"type": "function", "function": {"name": tool["function"]["name"]}})
        assert r.choices[0].finish_reason == "tool_calls"
        check_call(r.choices[0].message.tool_calls[0], tool)


def test_streamed_tool_call_deltas_have_openai_shape(tool_server):
    kwargs = dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}},
                  max_tokens=120)
    whole = chat(tool_server, **kwargs).choices[0].message.tool_calls[0]
    chunks = stream_chunks(tool_server, **kwargs)
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(deltas) >= 2, "the name first, then the arguments in pieces"
    first, rest = deltas[0], deltas[1:]
    assert first.index == 0 and first.id and first.type == "function" and first.function.name == "get_weather"
    assert all(d.index == 0 and d.id is None and d.function.name is None for d in rest)
    arguments = (first.function.arguments or "") + "".join(d.function.arguments or "" for d in rest)
    assert arguments == whole.function.arguments
    validate(json.loads(arguments), WEATHER["function"]["parameters"])
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_round_trip_call_then_tool_result_then_answer(tool_server):
    first = chat(tool_server, tools=[WEATHER], tool_choice="required", max_tokens=120).choices[0].message
    call = first.tool_calls[0]
    conversation = ASK + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": call.id, "type": "function",
                         "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees celsius."}]
    answer = chat(tool_server, messages=conversation, tools=[WEATHER], max_tokens=40)
    assert answer.choices[0].message.content, "the model answers in text after the tool result"
    assert answer.usage.prompt_tokens > chat(tool_server, tools=[WEATHER], max_tokens=1).usage.prompt_tokens
    # The tool message and the assistant's call go through the template: changing either changes the prompt.
    def count(messages):
        r = requests.post(tool_server.base_url + "/tokenize", timeout=30,
                          json={"model": "default", "messages": messages, "tools": [WEATHER]})
        assert r.status_code == 200, r.text
        return r.json()["count"]
    longer_result = [dict(m) for m in conversation]
    longer_result[-1]["content"] += " Light wind from the west in the afternoon."
    assert count(longer_result) > count(conversation)
    assert count(conversation) > count(conversation[:1])


def test_auto_and_none_leave_plain_text_as_content(tool_server):
    for choice in ("auto", "none"):
        r = chat(tool_server, tools=[WEATHER], tool_choice=choice, max_tokens=20)
        assert r.choices[0].message.tool_calls is None
        assert r.choices[0].message.content
        assert r.choices[0].finish_reason in ("stop", "length")


def test_enable_thinking_goes_to_the_template(tool_server):
    def prompt_count(kwargs):
        r = requests.post(tool_server.base_url + "/tokenize", timeout=30,
                          json={"model": "default", "messages": ASK, "chat_template_kwargs": kwargs})
        assert r.status_code == 200, r.text
        return r.json()["count"]
    # Qwen3's template writes an empty think block into the prompt when thinking is off.
    assert prompt_count({"enable_thinking": False}) > prompt_count({"enable_thinking": True})
    r = chat(tool_server, max_tokens=10, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].message.content and r.choices[0].message.reasoning_content is None


def test_tools_need_a_template_with_tool_support(plain_server):
    with pytest.raises(openai.BadRequestError) as e:
        chat(plain_server, tools=[WEATHER])
    assert e.value.body["param"] == "tools" and "tool" in e.value.body["message"]


def test_reasoning_content_whole_and_streamed(plain_server):
    whole = chat(plain_server, max_tokens=30).choices[0].message
    assert whole.reasoning_content, "deepseek_r1 reads a reply without </think> as reasoning"
    assert whole.content is None
    chunks = stream_chunks(plain_server, max_tokens=30)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert reasoning == whole.reasoning_content
    assert content == ""


def test_json_object_output_parses(plain_server):
    for stream in (False, True):
        kwargs = dict(response_format={"type": "json_object"}, max_tokens=80,
                      messages=[{"role": "user", "content": "Describe a cat as JSON."}])
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in stream_chunks(plain_server, **kwargs)
                           if c.choices)
        else:
            r = chat(plain_server, **kwargs)
            assert r.choices[0].finish_reason == "stop", "the object closed before max_tokens"
            text = r.choices[0].message.content
        assert isinstance(json.loads(text), dict), text


def test_json_schema_output_parses_and_validates(plain_server):
    schema = {"type": "object",
              "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                             "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 3},
                             "address": {"type": "object", "properties": {"city": {"type": "string"}},
                                         "required": ["city"]},
                             "vip": {"type": "boolean"}},
              "required": ["name", "age", "address", "vip"]}
    for seed in range(3):  # random sampling too: the mask, not the model's habits, keeps it valid
        r = chat(plain_server, temperature=1.0, seed=seed, max_tokens=200,
                 messages=[{"role": "user", "content": "Invent a person."}],
                 response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice
        value = json.loads(choice.message.content)
        validate(value, schema)
        assert list(value)[:2] == ["name", "age"], "properties come in the schema's order"


def test_unsupported_schema_keyword_is_named(plain_server):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3}}}
    with pytest.raises(openai.BadRequestError) as e:
        chat(plain_server, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert e.value.body["param"] == "response_format" and "minimum" in e.value.body["message"]
    # The server stays healthy for the next request.
    assert chat(plain_server, max_tokens=3).choices[0].finish_reason in ("stop", "length")
