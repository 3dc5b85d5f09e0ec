"""End-to-end tests of the server's access and load controls with the official openai client (raw HTTP where the
client would hide what we check): the API key, the waiting-queue bound, per-request timeouts, and fields the
server does not support. Default model (SmolLM2-135M-Instruct) on the CPU."""
import threading
import time

import openai
import pytest
import requests

from server_process import ServerProcess

API_KEY = "test-key-0123456789"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
# One running sequence at a time and one waiting: the third concurrent request finds the queue full.
SERVER_ARGS = ("--max-model-len", "2048", "--kv-cache-memory", "64MiB", "--max-num-seqs", "1",
               "--max-waiting-requests", "1")
# 1400 new tokens fit the 64MiB pool (1456 tokens per layer and head) and take far longer than the timeouts.
LONG = {"model": "default", "prompt": "Tell me a very long story.", "max_tokens": 1400, "ignore_eos": True}


@pytest.fixture(scope="module")
def server():
    s = ServerProcess(*SERVER_ARGS, "--api-key", API_KEY, api_key=API_KEY)
    yield s
    s.stop()


@pytest.fixture  # per test: a pooled connection left idle past the server's keep-alive would be stale
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def check_error(r, status, param=None):
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status and error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


def test_every_route_but_health_needs_the_key(server, client):
    assert requests.get(server.base_url + "/health", timeout=5).status_code == 200
    for method, path in [("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/v1/chat/completions"),
                         ("POST", "/v1/completions"), ("POST", "/tokenize"), ("POST", "/v1/prefix_cache/prune"),
                         ("GET", "/no/such/route")]:
        for headers in [{}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY},
                        {"Authorization": f"Bearer {API_KEY}x"}]:
            r = requests.request(method, server.base_url + path, json={}, headers=headers, timeout=10)
            error = check_error(r, 401)
            assert error["type"] == "AuthenticationError"
            assert r.headers["WWW-Authenticate"] == "Bearer"
    bad = openai.OpenAI(base_url=server.base_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert [m.id for m in client.models.list().data] == ["default"]
    r = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    assert r.choices[0].message.content


def test_the_key_can_come_from_the_environment():
    s = ServerProcess("--max-model-len", "512", env={"SPARSE_ENGINE_API_KEY": "from-env"})
    try:
        assert requests.get(s.base_url + "/v1/models", timeout=10).status_code == 401
        r = requests.get(s.base_url + "/v1/models", headers={"Authorization": "Bearer from-env"}, timeout=10)
        assert r.status_code == 200 and r.json()["data"][0]["id"] == "default"
    finally:
        s.stop()


def test_unsupported_fields_are_rejected_by_name(server, client):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    messages = [{"role": "user", "content": "Hi"}]
    # tools: this model's template renders none; response_format: a type the server does not know.
    for kwargs, param in [(dict(tools=tools), "tools"), (dict(response_format={"type": "regex"}), "response_format"),
                          (dict(presence_penalty=0.5), "presence_penalty"), (dict(logit_bias={"1": 5}),
                                                                              "logit_bias")]:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="default", messages=messages, max_tokens=3, **kwargs)
        assert e.value.body["param"] == param and param in e.value.body["message"]
    r = requests.post(server.base_url + "/v1/completions", json={"prompt": "x", "suffix": "y"}, headers=AUTH,
                      timeout=10)
    check_error(r, 400, "suffix")
    # Null means "not given", and the end-user tag never changes the output: both accepted.
    r = client.chat.completions.create(model="default", messages=messages, max_tokens=3, user="u-1",
                                       extra_body={"frequency_penalty": None})
    assert r.choices[0].message.content


def test_non_streaming_timeout_answers_408_and_frees_pages(server):
    before = server.metrics()
    started = time.time()
    r = requests.post(server.base_url + "/v1/completions", json={**LONG, "timeout": 0.5}, headers=AUTH, timeout=60)
    check_error(r, 408, "timeout")
    assert "timed out" in r.json()["error"]["message"]
    assert time.time() - started < 10
    # Aborted (counted as such once it had left the engine's inbox) and its pages back in the pool.
    m = server.wait_pages_free()
    assert m["sparse_engine_kv_pages_used"] == 0 and m["sparse_engine_num_requests_running"] == 0
    assert m["sparse_engine_generation_tokens_total"] < before["sparse_engine_generation_tokens_total"] + 1400


def test_streaming_timeout_ends_with_an_error_event(server, client):
    before = server.metrics()
    stream = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Tell a story"}],
                                            max_tokens=1400, stream=True, extra_body={"ignore_eos": True,
                                                                                      "timeout": 0.5})
    received = 0
    with pytest.raises(openai.APIError) as e:
        for chunk in stream:
            received += 1
    assert "timed out" in str(e.value)
    assert received >= 1  # the stream had started: the error arrives as an event, not a status
    m = server.wait_pages_free()
    assert m["sparse_engine_kv_pages_used"] == 0 and m["sparse_engine_num_requests_running"] == 0
    assert m["sparse_engine_generation_tokens_total"] < before["sparse_engine_generation_tokens_total"] + 1400


def test_a_full_queue_answers_503_with_retry_after(server, client):
    # Two long requests: one runs (--max-num-seqs 1), one waits, which fills the queue (--max-waiting-requests 1).
    # Their timeouts end them after the check (a fast machine may finish the first one first).
    results = []
    threads = [threading.Thread(target=lambda: results.append(requests.post(
        server.base_url + "/v1/completions", json={**LONG, "timeout": 8.0}, headers=AUTH, timeout=60)))
               for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.time() + 30
    while server.metrics()["sparse_engine_num_requests_waiting"] < 1:
        assert time.time() < deadline, ("the second request never queued", [r.text for r in results],
                                        server.metrics())
        time.sleep(0.05)
    r = requests.post(server.base_url + "/v1/completions", json={**LONG, "max_tokens": 2}, headers=AUTH, timeout=60)
    error = check_error(r, 503)
    assert r.headers["Retry-After"] == "1"
    assert "queue is full" in error["message"]
    with pytest.raises(openai.InternalServerError) as e:
        client.completions.create(model="default", prompt="Hi", max_tokens=2)
    assert e.value.status_code == 503
    for t in threads:
        t.join()
    assert all(r.status_code in (200, 408) for r in results)
    server.wait_pages_free()
    assert client.completions.create(model="default", prompt="Hi", max_tokens=2).choices[0].text is not None
