"""A soak of `sparse-engine serve`: mixed requests from concurrent clients against one CPU server (SnapKV with Chain
Cache, the Qwen3 chat template with hermes tool calls) whose small KV cache forces preemption and reclaims idle
chains. The mix: completions and chats, streamed or whole, streams abandoned mid-way, tool calls under every
tool_choice (streamed too), json_schema output, multi-turn chains with a prune between turns, and bad inputs. Each
outcome is checked against what its kind allows; afterwards every KV page is free, cached or held by an idle chain,
nothing runs or waits, the engine's request counters match what the clients saw, and the server still answers.

The CTest (test_serve_soak.py) runs 1,000 requests; the long run is a command:
    .venv/bin/python tests/cli/serve_soak.py --requests 10000 [--concurrency 24] [--max-seconds 7200]
which prints its figures as JSON; --kv-offloading-size GiB gives the server a host tier that keeps reclaimed chains
(a prune of a chain waiting there may then be blocked, and the session goes on unpruned)."""
import argparse
import collections
import concurrent.futures
import json
import random
import sys
import threading
import time

import requests

from schema_subset import validate
from server_process import SOURCE_DIR, ServerProcess

QWEN3_TEMPLATE = SOURCE_DIR / "tests" / "chat" / "templates" / "Qwen-Qwen3-0.6B.jinja"
# ~1,400 tokens of KV per layer and KV head, more than --max-model-len: every request fits alone, a handful of
# concurrent ones exhaust it (preemption), and idle chains are reclaimed for new work.
SERVER_ARGS = ("--kv-cache-memory", "64MiB", "--max-model-len", "448", "--max-num-seqs", "16",
               "--sparse-method", "snapkv", "--sparse-config", '{"budget": 96, "window": 16}',
               "--chat-template", str(QWEN3_TEMPLATE), "--tool-call-parser", "hermes")
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()
# Enumerated arguments keep a sampled call short enough to close within max_tokens.
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {
        "type": "object", "required": ["city", "unit"],
        "properties": {"city": {"enum": ["paris", "lima", "oslo"]}, "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["utc", "local"]}},
                                       "required": ["zone"]}}}
TOOLS = {"get_weather": WEATHER, "get_time": TIME}
SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"},
                                           "size": {"enum": ["small", "large"]}},
          "required": ["color", "ok", "size"]}
# Outcomes that are what a kind allows; anything else is a failure.
GOOD = {"ok", "disconnected", "rejected", "chain_reclaimed"}


def words(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


class Tally:
    """Generation requests the server accepted (answered 200), chain turns that resumed a chain, were rebuilt
    (preempted mid-turn) or found it reclaimed (404/410), and prunes blocked on a chain kept on the host tier,
    counted from every client thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self.accepted = 0
        self.resumed = 0
        self.rebuilt = 0
        self.gone = 0
        self.prunes_blocked = 0

    def add(self, resumed=False, rebuilt=False):
        with self._lock:
            self.accepted += 1
            self.resumed += resumed
            self.rebuilt += rebuilt

    def add_gone(self):
        with self._lock:
            self.gone += 1

    def add_prune_blocked(self):
        with self._lock:
            self.prunes_blocked += 1


class Client:
    def __init__(self, base_url: str):
        self.base_url = base_url
        self.session = requests.Session()

    def post(self, path, body, stream=False):
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        return self.session.post(self.base_url + path, data=data, stream=stream, timeout=600,
                                 headers={"Content-Type": "application/json"})


def stream_events(r):
    """The decoded data events of an SSE response (without [DONE]) and whether [DONE] ended it."""
    events, done = [], False
    for line in r.iter_lines():
        if not line.startswith(b"data: "):
            continue
        if line[6:] == b"[DONE]":
            done = True
            break
        events.append(json.loads(line[6:]))
    return events, done


def finished(choice_reason, allowed=("stop", "length")):
    return "ok" if choice_reason in allowed else f"finish_reason {choice_reason}"


def plain(client, rng, tally):
    """A completion or chat, streamed (40%) or whole."""
    stream = rng.random() < 0.4
    body = {"model": "default", "max_tokens": rng.randint(1, 12), "temperature": rng.choice([0, 0.7, 1.0]),
            "seed": rng.randint(0, 1000), "stream": stream}
    if rng.random() < 0.6:
        path, body["prompt"] = "/v1/completions", words(rng, 1, 40)
    else:
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": words(rng, 1, 40)}]
    with client.post(path, body, stream=stream) as r:
        if r.status_code != 200:
            return f"HTTP {r.status_code}: {r.text[:200]}"
        tally.add()
        if not stream:
            data = r.json()
            if data["usage"]["completion_tokens"] < 1:
                return f"no tokens: {data}"
            return finished(data["choices"][0]["finish_reason"])
        events, done = stream_events(r)
        if not done:
            return "stream without [DONE]"
        reasons = [c["choices"][0].get("finish_reason") for c in events if c["choices"]]
        return finished(reasons[-1] if reasons else None)


def abandoned(client, rng, tally):
    """A long stream the client leaves after two events: the server must abort it and free its pages."""
    body = {"model": "default", "prompt": words(rng, 4, 30), "max_tokens": 150, "ignore_eos": True, "stream": True}
    with client.post("/v1/completions", body, stream=True) as r:
        if r.status_code != 200:
            return f"HTTP {r.status_code}: {r.text[:200]}"
        tally.add()
        seen = 0
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                seen += 1
                if seen >= 2:
                    return "disconnected"  # leaving the block closes the connection mid-stream
    return "stream ended before the client left"


def tool_call(client, rng, tally):
    """A chat with tools under a random tool_choice; required and named choices must call a tool whose arguments
    satisfy its schema, streamed deltas must assemble into the same shape."""
    choice = rng.choice(["required", "named", "auto", "none"])
    tool_choice = ({"type": "function", "function": {"name": rng.choice(list(TOOLS))}} if choice == "named"
                   else choice)
    stream = rng.random() < 0.3
    body = {"model": "default", "messages": [{"role": "user", "content": "Weather or time? " + words(rng, 1, 8)}],
            "tools": [WEATHER, TIME], "tool_choice": tool_choice, "max_tokens": 160, "stream": stream,
            "temperature": rng.choice([0, 1.0]), "seed": rng.randint(0, 1000)}
    with client.post("/v1/chat/completions", body, stream=stream) as r:
        if r.status_code != 200:
            return f"HTTP {r.status_code}: {r.text[:200]}"
        tally.add()
        if stream:
            events, done = stream_events(r)
            if not done:
                return "stream without [DONE]"
            calls = collections.defaultdict(lambda: {"name": None, "arguments": ""})
            reason = None
            for c in events:
                if not c["choices"]:
                    continue
                delta = c["choices"][0].get("delta", {})
                for tc in delta.get("tool_calls") or []:
                    call = calls[tc["index"]]
                    call["name"] = call["name"] or tc.get("function", {}).get("name")
                    call["arguments"] += tc.get("function", {}).get("arguments") or ""
                reason = c["choices"][0].get("finish_reason") or reason
            calls = [{"function": c} for c in calls.values()]
        else:
            message = r.json()["choices"][0]
            reason, calls = message["finish_reason"], message["message"].get("tool_calls") or []
    if choice in ("required", "named"):
        if reason != "tool_calls" or len(calls) != 1:
            return f"{choice}: finish {reason} with {len(calls)} calls"
        function = calls[0]["function"]
        if choice == "named" and function["name"] != tool_choice["function"]["name"]:
            return f"named {tool_choice['function']['name']} but called {function['name']}"
        validate(json.loads(function["arguments"]), TOOLS[function["name"]]["function"]["parameters"])
        return "ok"
    if choice == "none" and calls:
        return "tool_choice none made a call"
    return finished(reason, ("stop", "length", "tool_calls"))


def structured(client, rng, tally):
    body = {"model": "default", "messages": [{"role": "user", "content": "Describe a thing. " + words(rng, 1, 6)}],
            "max_tokens": 120, "temperature": rng.choice([0, 1.0]), "seed": rng.randint(0, 1000),
            "response_format": {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}}}
    r = client.post("/v1/chat/completions", body)
    if r.status_code != 200:
        return f"HTTP {r.status_code}: {r.text[:200]}"
    tally.add()
    choice = r.json()["choices"][0]
    if choice["finish_reason"] != "stop":
        return f"json_schema output not closed: {choice}"
    validate(json.loads(choice["message"]["content"]), SCHEMA)
    return "ok"


def chain_session(client, rng, tally):
    """Two or three chat turns on one chain, each continuing append-only with a tool result, which a prune drops
    again after the turn that read it half the time. A chain reclaimed under memory pressure answers 410 (or its
    prune fails as reclaimed), which is what Chain Cache promises, and ends the session."""
    messages = [{"role": "system", "content": "You are a terse agent."},
                {"role": "user", "content": "Start: " + words(rng, 2, 10)}]
    chain_id = None
    for turn in range(rng.randint(2, 3)):
        body = {"model": "default", "messages": messages, "max_tokens": rng.randint(2, 10), "temperature": 0,
                "chain_id": chain_id}
        if chain_id is not None:
            body["chain_append_start"] = len(messages) - 1
        r = client.post("/v1/chat/completions", body)
        if chain_id is not None and r.status_code in (404, 410):
            tally.add_gone()
            return "chain_reclaimed"
        if r.status_code != 200:
            return f"turn {turn}: HTTP {r.status_code}: {r.text[:200]}"
        data = r.json()
        tally.add(resumed=data.get("chain_status") == "resumed", rebuilt=data.get("chain_status") == "rebuilt")
        expected = ("created",) if chain_id is None else ("resumed", "rebuilt")
        if data.get("chain_status") not in expected:
            return f"turn {turn}: chain_status {data.get('chain_status')}"
        chain_id = data["chain_id"]
        messages.append({"role": "assistant", "content": data["choices"][0]["message"]["content"]})
        if turn > 0 and rng.random() < 0.5:
            outcome = prune_tool_result(client, chain_id, messages)
            if outcome == "blocked":  # the chain waits on the host tier, whole: the session goes on unpruned
                tally.add_prune_blocked()
            elif outcome != "ok":
                return outcome
        messages.append({"role": "user", "content": "Result: " + words(rng, 40, 90)})
    return "ok"


def prune_tool_result(client, chain_id, messages):
    """Prunes the tool result before the chain's last reply (messages[-2]) to 8 tokens."""
    count = lambda m: client.post("/tokenize", {"messages": m, "add_generation_prompt": False}).json()["count"]
    start, end = count(messages[:-2]), count(messages[:-1])
    r = client.post("/v1/prefix_cache/prune", {"chain_id": chain_id, "range_start": start, "range_end": end,
                                               "keep_tokens": 8, "policy": "snapkv_global"})
    if r.status_code != 202:
        return f"prune: HTTP {r.status_code}: {r.text[:200]}"
    prune_id = r.json()["prune_id"]
    while True:
        status = client.session.get(client.base_url + f"/v1/prefix_cache/prune/{prune_id}", timeout=60).json()
        if status["status"] != "queued":
            break
        time.sleep(0.05)
    if status["status"] == "completed":
        return "ok"
    if status["status"] == "failed" and "was reclaimed" in status["reason"]:
        return "chain_reclaimed"
    if status["status"] == "blocked" and "host tier" in status["reason"]:
        return "blocked"
    return f"prune {status}"


def bad_input(client, rng, tally):
    """A request the server must refuse with this exact 4xx, leaving every other request alone."""
    chat = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    cases = [
        (b'{"model": "default", "prompt": "unterminated', 400, "/v1/completions"),
        (dict(chat, temperature=-1), 400, None),
        (dict(chat, top_p=1.5), 400, None),
        (dict(chat, max_tokens=-3), 400, None),
        (dict(chat, n=0), 400, None),
        (dict(chat, frobnicate=True), 400, None),
        ({"model": "default", "max_tokens": 4}, 400, None),
        ({"model": "default", "prompt": "word " * 600, "max_tokens": 4}, 400, "/v1/completions"),
        (dict(chat, chain_id="no-such-chain"), 404, None),
        (dict(chat, response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "integer", "minimum": 3}}}), 400, None),
        (dict(chat, tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
              tool_choice={"type": "function", "function": {"name": "not_offered"}}), 400, None),
    ]
    body, status, path = rng.choice(cases)
    r = client.post(path or "/v1/chat/completions", body)
    return "rejected" if r.status_code == status else f"bad input answered {r.status_code}, not {status}: {body}"


KINDS = [(plain, 0.37), (abandoned, 0.08), (tool_call, 0.14), (structured, 0.08), (chain_session, 0.13),
         (bad_input, 0.20)]


def run_one(base_url, seed, tally: Tally):
    rng = random.Random(seed)
    kind = rng.choices([k for k, _ in KINDS], weights=[w for _, w in KINDS])[0]
    try:
        return kind.__name__, kind(Client(base_url), rng, tally)
    except Exception as e:  # a broken response is a finding, not a crash of the driver
        return kind.__name__, f"{type(e).__name__}: {e}"


def soak(server: ServerProcess, num_requests: int, concurrency: int, max_seconds: float, seed: int = 1234):
    """Runs the soak against `server` and returns its figures; raises AssertionError on any failure."""
    tally = Tally()
    started = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(lambda i: run_one(server.base_url, seed * 1_000_003 + i, tally),
                                range(num_requests)))
    seconds = time.time() - started
    outcomes = collections.Counter(f"{kind}:{o if o in GOOD else 'FAILED'}" for kind, o in results)
    failures = [(kind, o) for kind, o in results if o not in GOOD]
    assert not failures, (len(failures), failures[:5])
    assert seconds <= max_seconds, f"{num_requests} requests took {seconds:.0f} s (bound {max_seconds:.0f} s)"

    m = server.wait_pages_free(timeout_s=120)
    assert m["sparse_engine_kv_pages_used"] == 0, m
    assert m["sparse_engine_num_requests_running"] == 0 and m["sparse_engine_num_requests_waiting"] == 0
    assert (m["sparse_engine_kv_pages_free"] + m["sparse_engine_kv_pages_cached"] + m["sparse_engine_kv_pages_chains"]
            == m["sparse_engine_kv_pages_total"]), m
    assert m["sparse_engine_preemptions_total"] > 0
    engine_requests = m["sparse_engine_requests_finished_total"] + m["sparse_engine_requests_aborted_total"]
    assert engine_requests == tally.accepted, (engine_requests, tally.accepted)
    assert server.proc.poll() is None
    after = requests.post(server.base_url + "/v1/completions",
                          json={"model": "default", "prompt": "Still alive?", "max_tokens": 2}, timeout=60)
    assert after.status_code == 200
    return {"requests": num_requests, "concurrency": concurrency, "seconds": round(seconds, 1),
            "requests_per_second": round(num_requests / seconds, 2), "outcomes": dict(sorted(outcomes.items())),
            "generation_requests": tally.accepted, "chain_turns_resumed": tally.resumed,
            "chain_turns_rebuilt": tally.rebuilt, "chain_turns_gone": tally.gone,
            "chain_prunes_blocked": tally.prunes_blocked,
            "host_pages_total": m.get("sparse_engine_kv_host_pages_total", 0),
            "host_pages_used": m.get("sparse_engine_kv_host_pages_used", 0),
            "chains_on_host": m.get("sparse_engine_num_chains_on_host", 0),
            "preemptions": m["sparse_engine_preemptions_total"],
            "chains_left": m["sparse_engine_num_chains"], "pages_total": m["sparse_engine_kv_pages_total"],
            "pages_free": m["sparse_engine_kv_pages_free"], "pages_chains": m["sparse_engine_kv_pages_chains"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--max-seconds", type=float, default=7200)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--kv-offloading-size", default="0",
                        help="GiB of host tier the server keeps idle chains in (the server flag; 0 = none)")
    args = parser.parse_args()
    server = ServerProcess(*SERVER_ARGS, "--kv-offloading-size", args.kv_offloading_size)
    try:
        figures = soak(server, args.requests, args.concurrency, args.max_seconds, args.seed)
    finally:
        code = server.terminate()
        server.stop()
    figures["exit_code_after_sigterm"] = code
    json.dump(figures, sys.stdout, indent=2)
    print()
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
