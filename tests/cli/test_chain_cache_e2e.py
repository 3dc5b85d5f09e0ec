"""Chain Cache end to end: `sparse-engine serve` with SnapKV on the default model (SmolLM2-135M-Instruct) and the
official openai client sending the chain fields as extra body. A 10-turn agent-style conversation (a system
prompt, tool-call replies and growing tool results) resumes its chain every turn; the error statuses of the
chain API; streaming carries the chain fields too; `bench replay --chain` runs at a tiny scale."""
import json
import subprocess

import openai
import pytest
import requests

from server_process import BINARY, ServerProcess

SYSTEM = ("You are a coding agent. You call tools by answering with one line `CALL tool(args)`, and you read "
          "their results before you answer. Be brief. " * 4)


@pytest.fixture(scope="module")
def server():
    s = ServerProcess("--max-model-len", "4096", "--kv-cache-memory", "256MiB", "--sparse-method", "snapkv",
                      "--sparse-config", '{"budget": 256, "window": 32}')
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)


def tool_result(turn):
    rows = "\n".join(f"{turn:02d}-{i:03d} | file_{i % 7}.py | {i * 37 % 101} matches | ok"
                     for i in range(4 + 2 * turn))
    return f"Tool result for call {turn}:\n{rows}"


def call(client, messages, **extra):
    raw = client.chat.completions.with_raw_response.create(model="default", messages=messages, max_tokens=16,
                                                           temperature=0, extra_body=extra)
    return raw.headers, raw.parse()


def test_ten_turn_tool_conversation_resumes_every_turn(client):
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Find where the config file is parsed and summarize it."}]
    headers, r = call(client, messages, chain_id=None)
    chain_id = r.model_extra["chain_id"]
    assert chain_id and headers["X-SparseVLLM-Chain-ID"] == chain_id
    assert r.model_extra["chain_status"] == "created"
    for turn in range(1, 10):
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
        append_start = len(messages)
        messages.append({"role": "user", "content": tool_result(turn)})
        previous_prompt = r.usage.prompt_tokens + r.usage.completion_tokens
        headers, r = call(client, messages, chain_id=chain_id, chain_append_start=append_start)
        assert r.model_extra["chain_id"] == chain_id and headers["X-SparseVLLM-Chain-ID"] == chain_id
        assert r.model_extra["chain_status"] == "resumed", f"turn {turn}"
        cached = r.usage.prompt_tokens_details.cached_tokens
        # Everything the last turn computed is reused: its prompt and all but its last generated token.
        assert cached == previous_prompt - 1, f"turn {turn}"
        assert r.usage.prompt_tokens > cached


def test_full_history_resume_and_mismatch(server, client):
    messages = [{"role": "user", "content": "Count to three."}]
    _, r = call(client, messages, chain_id=None)
    chain_id = r.model_extra["chain_id"]
    # The same conversation sent in full resumes when it re-tokenizes to the chain's tokens; an edited history
    # never does.
    edited = [{"role": "user", "content": "Count to four."}, {"role": "assistant", "content": "1"},
              {"role": "user", "content": "More."}]
    body = {"model": "default", "messages": edited, "max_tokens": 4, "chain_id": chain_id}
    reply = requests.post(server.base_url + "/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 409, reply.text
    assert "does not extend" in reply.json()["error"]["message"]
    # The chain is intact after the conflict.
    messages += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "Go on."}]
    _, again = call(client, messages, chain_id=chain_id, chain_append_start=2)
    assert again.model_extra["chain_status"] == "resumed"


@pytest.mark.parametrize("body, status, param", [
    ({"chain_id": "no-such-chain"}, 404, "chain_id"),
    ({"chain_id": 7}, 400, "chain_id"),
    ({"chain_append_start": 1}, 400, "chain_append_start"),
    ({"chain_id": None, "n": 2}, 400, "n"),
])
def test_chain_errors(server, body, status, param):
    request = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **body}
    r = requests.post(server.base_url + "/v1/chat/completions", json=request, timeout=60)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_streaming_carries_the_chain(client):
    stream = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hello!"}],
                                            max_tokens=8, temperature=0, stream=True, extra_body={"chain_id": None})
    chunks = list(stream)
    chain_ids = {c.model_extra.get("chain_id") for c in chunks}
    assert len(chain_ids) == 1 and next(iter(chain_ids))
    assert chunks[-1].model_extra.get("chain_status") == "created"


def test_bench_replay_with_chains_avoids_prefill(server, tmp_path):
    result = tmp_path / "replay.json"
    subprocess.run([str(BINARY), "bench", "replay", "--base-url", server.base_url, "--num-sessions", "2",
                    "--min-turns", "2", "--max-turns", "2", "--system-prompt-words", "60",
                    "--min-tool-result-words", "30", "--max-tool-result-words", "60", "--output-len", "4",
                    "--chain", "--result-json", str(result)], check=True, timeout=600)
    r = json.loads(result.read_text())
    assert r["completed_turns"] == r["planned_turns"] == 4
    assert r["total_output_tokens"] == 4 * 4
    # Every second turn resumes its chain: at least the first turn's prompt is not prefilled again.
    assert 0 < r["prefill_tokens_avoided"] < r["total_prompt_tokens"]
    assert r["mean_ttft_ms"] > 0


def test_inspect_and_match_show_what_a_chain_caches(server, client):
    prompt = [{"role": "user", "content": "Name a color."}]
    _, r = call(client, prompt, chain_id=None)
    chain_id = r.model_extra["chain_id"]
    post = lambda path, body: requests.post(server.base_url + path, json=body, timeout=60)
    info = post("/v1/prefix_cache/inspect", {"chain_id": chain_id})
    assert info.status_code == 200, info.text
    info = info.json()
    assert info["status"] == "idle" and info["num_held_pages"] > 0
    assert info["num_tokens"] == r.usage.prompt_tokens + r.usage.completion_tokens

    messages = prompt + [{"role": "assistant", "content": r.choices[0].message.content},
                         {"role": "user", "content": "Another one."}]
    _, turn2 = call(client, messages, chain_id=chain_id, chain_append_start=2)
    info2 = post("/v1/prefix_cache/inspect", {"chain_id": chain_id}).json()
    assert info2["num_tokens"] == turn2.usage.prompt_tokens + turn2.usage.completion_tokens
    cached_ids = info2["token_ids"]
    assert len(cached_ids) == info2["num_tokens"]
    match = post("/v1/prefix_cache/match", {"chain_id": chain_id, "token_ids": cached_ids + [42]}).json()
    assert match["extends"] is True and match["cached_tokens"] == len(cached_ids) - 1
    edited = post("/v1/prefix_cache/match", {"chain_id": chain_id, "token_ids": [42] + cached_ids}).json()
    assert edited["extends"] is False and edited["cached_tokens"] == 0
    assert post("/v1/prefix_cache/inspect", {"chain_id": "nope"}).status_code == 404
    assert post("/v1/prefix_cache/match", {"chain_id": chain_id, "token_ids": "x"}).status_code == 400


def test_prune_of_a_chain_drops_a_tool_result_and_the_chain_resumes(server, client):
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Find the config parser."}]
    _, r = call(client, messages, chain_id=None)
    chain_id = r.model_extra["chain_id"]
    messages += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": tool_result(20)}]
    _, r = call(client, messages, chain_id=chain_id, chain_append_start=3)
    assert r.model_extra["chain_status"] == "resumed"
    post = lambda path, body: requests.post(server.base_url + path, json=body, timeout=120)
    held = post("/v1/prefix_cache/inspect", {"chain_id": chain_id}).json()["num_held_pages"]
    # The tool result's tokens: the last message, as the chat template renders it.
    count = lambda m: post("/tokenize", {"messages": m, "add_generation_prompt": False}).json()["count"]
    start, end = count(messages[:-1]), count(messages)
    assert end - start > 64

    accepted = post("/v1/prefix_cache/prune", {"chain_id": chain_id, "range_start": start, "range_end": end,
                                               "keep_tokens": 16, "policy": "snapkv_global"})
    assert accepted.status_code == 202, accepted.text
    status = server.wait_prune(accepted.json()["prune_id"])
    assert status["status"] == "completed", status
    (pruned,) = status["ranges"]
    assert pruned["effective_range"] == [start, end] and pruned["kept_tokens"] == 16
    assert all(start <= p < end for p in pruned["kept_positions"])
    after = post("/v1/prefix_cache/inspect", {"chain_id": chain_id}).json()
    assert status["pages_freed"] > 0 and after["num_held_pages"] == held - status["pages_freed"]

    messages += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": "Summarize what you found."}]
    _, r = call(client, messages, chain_id=chain_id, chain_append_start=5)
    assert r.model_extra["chain_status"] == "resumed"
    assert r.usage.prompt_tokens_details.cached_tokens > 0 and r.choices[0].message.content

    unknown = post("/v1/prefix_cache/prune", {"chain_id": "no-such-chain", "range_start": 0, "range_end": 8,
                                              "keep_tokens": 1, "policy": "snapkv_global"})
    assert unknown.status_code == 202
    failed = server.wait_prune(unknown.json()["prune_id"])
    assert failed["status"] == "failed" and "does not exist" in failed["reason"]
