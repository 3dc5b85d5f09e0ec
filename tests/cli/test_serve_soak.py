"""Soak test of `sparse-engine serve`: 1,000 mixed requests (completions and chat, random lengths, some streamed,
some abandoned mid-stream) against a server whose small KV cache forces preemption; afterwards every KV page is
back, nothing runs or waits, and the server still answers."""
import concurrent.futures
import json
import random

import requests

from server_process import ServerProcess

NUM_REQUESTS = 1000
CONCURRENCY = 24
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def make_request(rng: random.Random):
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 24)))
    kind = rng.random()
    stream = kind < 0.4
    disconnect = kind < 0.1
    body = {"model": "default", "max_tokens": rng.randint(1, 8), "temperature": rng.choice([0, 0.7, 1.0]),
            "seed": rng.randint(0, 1000), "stream": stream}
    if disconnect:
        body["max_tokens"] = 150
        body["ignore_eos"] = True
    if rng.random() < 0.7:
        return "/v1/completions", dict(body, prompt=prompt), disconnect
    messages = [{"role": "user", "content": prompt}]
    return "/v1/chat/completions", dict(body, messages=messages), disconnect


def run_one(base_url: str, path: str, body: dict, disconnect: bool) -> str:
    """'ok', 'disconnected' or a description of what went wrong."""
    with requests.post(base_url + path, json=body, stream=body["stream"], timeout=300) as r:
        if r.status_code != 200:
            return f"HTTP {r.status_code}: {r.text}"
        if not body["stream"]:
            data = r.json()
            ok = data["usage"]["completion_tokens"] >= 1 and data["choices"][0]["finish_reason"] in ("stop", "length")
            return "ok" if ok else f"bad response {data}"
        events = []
        for line in r.iter_lines():
            if not line.startswith(b"data: "):
                continue
            events.append(line[6:])
            if disconnect and len(events) >= 2:
                return "disconnected"  # leaving the block closes the connection mid-stream
        if events[-1] != b"[DONE]":
            return f"stream without [DONE]: {events[-3:]}"
        finishes = [c["choices"][0].get("finish_reason") for c in map(json.loads, events[:-1]) if c["choices"]]
        return "ok" if finishes[-1] in ("stop", "length") else f"bad finish {finishes}"


def test_soak_mixed_requests_leave_no_pages_behind():
    # ~270 tokens of KV per layer and head (more than --max-model-len, so every request fits alone): a handful of
    # concurrent requests exhaust it and force preemption.
    s = ServerProcess("--kv-cache-memory", "12MiB", "--max-model-len", "256", "--max-num-seqs", "16")
    try:
        rng = random.Random(1234)
        jobs = [make_request(rng) for _ in range(NUM_REQUESTS)]
        with concurrent.futures.ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
            outcomes = list(pool.map(lambda job: run_one(s.base_url, *job), jobs))
        failures = [o for o in outcomes if o not in ("ok", "disconnected")]
        assert not failures, failures[:5]
        assert outcomes.count("disconnected") == sum(job[2] for job in jobs)

        m = s.wait_pages_free(timeout_s=60)
        assert m["sparse_engine_kv_pages_used"] == 0
        assert m["sparse_engine_num_requests_running"] == 0
        assert m["sparse_engine_num_requests_waiting"] == 0
        assert (m["sparse_engine_kv_pages_free"] + m["sparse_engine_kv_pages_cached"]
                == m["sparse_engine_kv_pages_total"])
        assert m["sparse_engine_preemptions_total"] > 0
        assert m["sparse_engine_requests_finished_total"] + m["sparse_engine_requests_aborted_total"] == NUM_REQUESTS
        assert s.proc.poll() is None
        after = requests.post(s.base_url + "/v1/completions",
                              json={"model": "default", "prompt": "Still alive?", "max_tokens": 2}, timeout=60)
        assert after.status_code == 200
    finally:
        assert s.terminate() == 0
        s.stop()
