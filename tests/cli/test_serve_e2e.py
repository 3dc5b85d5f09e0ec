"""End-to-end tests of `sparse-engine serve` with the official openai client (and raw HTTP where the client would
hide what we check), on the default model (SmolLM2-135M-Instruct)."""
import concurrent.futures
import json
import time

import openai
import pytest
import requests

from server_process import ServerProcess

MAX_MODEL_LEN = 2048
# ~1450 tokens of KV per layer and head for SmolLM2-135M (30 layers x 3 KV heads x 64 dims, fp32 pages): less
# than --max-model-len, so some valid-length requests can never fit.
KV_CACHE_MEMORY = "64MiB"
MAX_N = 4

PROMPTS = [
    "The capital of France is", "Water boils at", "The largest planet in our solar system is",
    "A haiku about the sea:", "def fibonacci(n):", "The three primary colors are", "Once upon a time, a dragon",
    "The speed of light is", "My favourite breakfast is", "In 1969, humans", "The recipe for pancakes needs",
    "Photosynthesis converts", "The opposite of hot is", "A good name for a cat is", "Mount Everest is",
    "The first rule of programming is",
]


@pytest.fixture(scope="module")
def server():
    s = ServerProcess("--max-model-len", str(MAX_MODEL_LEN), "--kv-cache-memory", KV_CACHE_MEMORY,
                      "--max-n", str(MAX_N), "--max-num-seqs", "32")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def chat(client, content, **kwargs):
    kwargs.setdefault("max_tokens", 12)
    kwargs.setdefault("temperature", 0)
    return client.chat.completions.create(model="default", messages=[{"role": "user", "content": content}], **kwargs)


def expect_error(server, path, body, status, param=None, raw=None):
    """Posts `body` (or the raw bytes) and checks the status and the OpenAI error shape."""
    if raw is None:
        r = requests.post(server.base_url + path, json=body, timeout=60)
    else:
        r = requests.post(server.base_url + path, data=raw, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["code"] == status
    if param is not None:
        assert error["param"] == param, error
    return error


def test_models_and_health(server, client):
    models = client.models.list().data
    assert [m.id for m in models] == ["default"]
    assert models[0].owned_by == "sparse-engine"
    assert models[0].created > 0
    assert requests.get(server.base_url + "/health", timeout=5).status_code == 200


def test_chat_non_streaming(client):
    r = chat(client, "Say hello.")
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 5
    assert 0 < r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streaming_matches_non_streaming(client):
    full = chat(client, "Name a fruit.")
    chunks = list(chat(client, "Name a fruit.", stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_prompt_forms_and_streaming(client):
    kwargs = dict(model="default", max_tokens=10, temperature=0)
    text = client.completions.create(prompt="The capital of France is", **kwargs)
    assert text.object == "text_completion" and text.id.startswith("cmpl-")
    listed = client.completions.create(prompt=["The capital of France is"], **kwargs)
    assert listed.choices[0].text == text.choices[0].text
    streamed = client.completions.create(prompt="The capital of France is", stream=True, **kwargs)
    assert "".join(c.choices[0].text for c in streamed) == text.choices[0].text
    ids = client.completions.create(prompt=[504, 3575, 282, 4649, 314], **kwargs)
    assert ids.usage.prompt_tokens == 5
    assert ids.choices[0].text


def test_concurrent_greedy_equals_sequential(client):
    def run(prompt):
        return client.completions.create(model="default", prompt=prompt, max_tokens=12, temperature=0).choices[0].text

    sequential = [run(p) for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        concurrent_results = list(pool.map(run, PROMPTS))
    assert concurrent_results == sequential


def test_repeated_system_prompt_hits_the_prefix_cache(client):
    system = "You are a meticulous assistant. " + " ".join(
        f"Rule {i}: always answer politely, briefly and truthfully." for i in range(30))
    usages = []
    for question in ["What is 2+2?", "Name a color.", "Name an animal."]:
        r = client.chat.completions.create(model="default", max_tokens=4, temperature=0,
                                           messages=[{"role": "system", "content": system},
                                                     {"role": "user", "content": question}])
        usages.append(r.usage)
    assert usages[0].prompt_tokens > 300
    assert usages[1].prompt_tokens_details.cached_tokens > 200
    assert usages[2].prompt_tokens_details.cached_tokens > 200


def test_chat_logprobs(client):
    r = chat(client, "Count to five.", max_tokens=8, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert entry.logprob == pytest.approx(values[0], abs=1e-4)  # greedy picks the most likely token
        assert entry.logprob <= 0
        assert bytes(entry.bytes).decode("utf-8", errors="replace") == entry.token
    assert "".join(e.token for e in content).startswith(r.choices[0].message.content)


def test_completion_logprobs(client):
    r = client.completions.create(model="default", prompt="One, two, three,", max_tokens=6, temperature=0,
                                  logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert lp.text_offset[0] == 0
    for i in range(1, 6):
        assert lp.text_offset[i] == lp.text_offset[i - 1] + len(lp.tokens[i - 1])
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert token in top and top[token] == pytest.approx(logprob)
        assert 1 <= len(top) <= 3
    assert "".join(lp.tokens) == r.choices[0].text


def test_stop_strings(client):
    kwargs = dict(model="default", prompt="List the days of the week: Monday,", max_tokens=16, temperature=0)
    free = client.completions.create(**kwargs).choices[0].text
    words = free.split()
    assert len(words) >= 3, free
    stop = words[1]
    expected = free[:free.index(stop)]
    stopped = client.completions.create(stop=[stop, "never-appears"], **kwargs)
    assert stopped.choices[0].text == expected
    assert stopped.choices[0].finish_reason == "stop"
    streamed = client.completions.create(stop=stop, stream=True, **kwargs)
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_n_choices_are_seeded(client):
    kwargs = dict(model="default", prompt="A random animal:", max_tokens=8, temperature=1.0, n=3, seed=7)
    first = client.completions.create(**kwargs)
    again = client.completions.create(**kwargs)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert 3 <= first.usage.completion_tokens <= 24
    assert len({c.text for c in first.choices}) > 1  # seed + i: the choices differ
    streamed = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=5, n=2, seed=3, stream=True)
    assert {c.choices[0].index for c in streamed if c.choices} == {0, 1}


def test_disconnect_aborts_and_frees_pages(server):
    before = server.metrics()
    body = {"model": "default", "prompt": "Tell me a very long story.", "max_tokens": 1000, "ignore_eos": True,
            "stream": True}
    with requests.post(server.base_url + "/v1/completions", json=body, stream=True, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        received = 0
        for line in lines:
            if line.startswith(b"data: "):
                received += 1
            if received >= 3:
                break
    # The connection is closed now; the server notices, aborts the request and frees its pages.
    deadline = time.time() + 30
    while time.time() < deadline:
        m = server.metrics()
        if m["sparse_engine_requests_aborted_total"] > before["sparse_engine_requests_aborted_total"]:
            break
        time.sleep(0.2)
    m = server.wait_pages_free()
    assert m["sparse_engine_requests_aborted_total"] == before["sparse_engine_requests_aborted_total"] + 1
    assert m["sparse_engine_kv_pages_used"] == 0
    assert (m["sparse_engine_kv_pages_free"] + m["sparse_engine_kv_pages_cached"]
            == m["sparse_engine_kv_pages_total"])
    assert m["sparse_engine_generation_tokens_total"] < before["sparse_engine_generation_tokens_total"] + 1000


def test_metrics_exposition(server, client):
    chat(client, "Hello there", max_tokens=3)
    text = requests.get(server.base_url + "/metrics", timeout=10)
    assert text.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    m = server.metrics()
    assert m["sparse_engine_kv_pages_total"] > 0
    assert m["sparse_engine_prompt_tokens_total"] > 0
    assert m["sparse_engine_generation_tokens_total"] > 0
    assert m["sparse_engine_requests_finished_total"] > 0
    for name in ["time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds"]:
        count = m[f"sparse_engine_{name}_count"]
        assert count > 0
        assert m[f"sparse_engine_{name}_bucket[+Inf]"] == count
        assert m[f"sparse_engine_{name}_sum"] > 0
    assert 0 <= m["sparse_engine_prefix_cache_hit_rate"] <= 1


BAD_REQUESTS = [
    # (path, body, status, param)
    ("/v1/completions", {"model": "default", "prompt": "x", "max_tokens": "10"}, 400, "max_tokens"),
    ("/v1/completions", {"model": "default", "prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"model": "default", "prompt": "x", "stop": 3}, 400, "stop"),
    ("/v1/completions", {"model": "default", "prompt": "x", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"model": "default", "prompt": 12.5}, 400, "prompt"),
    ("/v1/chat/completions", {"model": "default", "messages": "hi"}, 400, "messages"),
    ("/v1/completions", {"model": "gpt-4", "prompt": "x"}, 404, "model"),
    ("/v1/chat/completions", {"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
    ("/v1/completions", {"model": "default", "prompt": "x", "max_tokens": -5}, 400, None),
    ("/v1/completions", {"model": "default", "prompt": "x", "max_tokens": 10**9}, 400, "max_tokens"),
    ("/v1/completions", {"model": "default", "prompt": "x", "max_tokens": 10**15}, 400, "max_tokens"),
    ("/v1/completions", {"model": "default", "prompt": "x", "n": MAX_N + 1}, 400, "n"),
    ("/v1/completions", {"model": "default", "prompt": [1] * (MAX_MODEL_LEN + 10), "max_tokens": 1}, 400, "prompt"),
    ("/v1/chat/completions", {"model": "default", "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"model": "default", "messages": [{"role": "wizard", "content": "x"}]}, 400,
     "messages[0].role"),
    ("/v1/completions", {"model": "default", "prompt": "x", "temperature": -1}, 400, None),
    ("/v1/completions", {"model": "default", "prompt": "x", "top_p": 1.5}, 400, None),
    ("/v1/completions", {"model": "default", "prompt": "x", "top_k": -7}, 400, None),
    ("/v1/completions", {"model": "default", "prompt": "x", "logprobs": 50}, 400, "logprobs"),
    ("/v1/completions", {"model": "default", "prompt": [99999999]}, 400, None),
    # Fits --max-model-len but not the KV cache (~1450 tokens per layer and head).
    ("/v1/completions", {"model": "default", "prompt": [1000] * 1800, "max_tokens": 10}, 400, None),
]


@pytest.mark.parametrize("path,body,status,param", BAD_REQUESTS)
def test_bad_requests_get_openai_errors(server, client, path, body, status, param):
    expect_error(server, path, body, status, param)
    assert chat(client, "Still there?", max_tokens=2).choices[0].message.content is not None


def test_malformed_bodies(server, client):
    expect_error(server, "/v1/completions", None, 400, raw=b'{"prompt": "x", ')
    expect_error(server, "/v1/completions", None, 400, raw=b'{"prompt": "caf\xc3\x28"}')
    expect_error(server, "/v1/chat/completions", None, 400, raw=b"[1, 2, 3]")
    expect_error(server, "/v1/completions", None, 400, raw=b"")
    r = requests.get(server.base_url + "/v1/nothing-here", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == 404
    r = requests.get(server.base_url + "/v1/completions", timeout=10)
    assert r.status_code == 405
    assert chat(client, "Still there?", max_tokens=2).choices[0].message.content is not None


def test_openai_client_raises_typed_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="default", prompt="x", max_tokens=2, n=MAX_N + 1)
    assert "n" == info.value.body["param"]


def test_sigterm_drains_then_exits_cleanly():
    s = ServerProcess("--max-model-len", "1024", "--drain-timeout", "300")
    try:
        body = {"model": "default", "prompt": "Count slowly:", "max_tokens": 64, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
        with requests.post(s.base_url + "/v1/completions", json=body, stream=True, timeout=120) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith(b"data: "))
            assert json.loads(first[6:])["object"] == "text_completion"
            s.proc.send_signal(15)
            # Draining: new work and /health are refused while the stream in flight finishes.
            deadline = time.time() + 10
            while requests.get(s.base_url + "/health", timeout=5).status_code != 503:
                assert time.time() < deadline
                time.sleep(0.05)
            refused = requests.post(s.base_url + "/v1/completions", json={"prompt": "x", "max_tokens": 1},
                                    timeout=10)
            assert refused.status_code == 503 and refused.json()["error"]["code"] == 503
            events = [line[6:] for line in lines if line.startswith(b"data: ")]
        assert events[-1] == b"[DONE]"
        last = json.loads(events[-2])
        assert "usage" in last, f"the stream did not finish inside the drain: {last}"
        assert last["usage"]["completion_tokens"] == 64
        assert s.proc.wait(timeout=60) == 0
    finally:
        s.stop()
