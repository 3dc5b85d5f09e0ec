"""--kv-cache-dtype end to end: `sparse-engine methods` says which stores each method can keep its KV in; an
unknown value or a method the store cannot take fails before the model loads (exit 2, the reason on one line);
a server over FP8 pages answers the openai client, and a chain resumed from FP8 KV answers exactly what the same
conversation sent without its chain does; servers over KIVI-4 and TurboQuant pages answer the openai client what a
lone `generate` over the same store answers; SnapKV over KIVI-4 keeps a chain between turns."""
import json
import subprocess

import openai
import pytest

from server_process import BINARY, ServerProcess


# Query-aware page selection's ops (Quest's), which read FP8 and KIVI pages on the CPU.
PAGE_SELECTION = {"update_page_key_bounds", "select_pages_by_key_bounds", "paged_attention over a selection"}
TURBOQUANT = ["turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "turboquant_2.5",
              "turboquant_3.5"]


def run(*args, timeout=120):
    return subprocess.run([str(BINARY), *args], capture_output=True, text=True, timeout=timeout)


def test_methods_list_the_stores_each_method_takes():
    r = run("methods", "--json", timeout=60)
    assert r.returncode == 0, r.stderr
    methods = {m["name"]: m for m in json.loads(r.stdout)}
    for m in methods.values():
        assert m["kv_cache_dtypes"][0] == "auto", m  # every method keeps explicit pages
        # FP8 exactly under the methods whose ops all read it (eviction's row copies, attention_scores and, on the
        # CPU, page selection by key bounds).
        evicts_over_fp8 = set(m["ops"]) <= {"compact_kv", "move_kv_rows", "attention_scores"}
        selects_pages = bool(m["ops"]) and set(m["ops"]) <= PAGE_SELECTION and m["keeps_full_history"]
        assert ("fp8_e4m3" in m["kv_cache_dtypes"]) == (evicts_over_fp8 or selects_pages), m
        # TurboQuant under the methods that evict over FP8 (its slots move whole and attention_scores reads their
        # keys); KIVI under the methods with no ops of their own, the prompt-time methods that score and evict the
        # prompt before it is quantized (the SnapKV family), those that drop whole quantized groups and page
        # selection, which reads whole groups.
        for store in TURBOQUANT:
            assert (store in m["kv_cache_dtypes"]) == evicts_over_fp8, m
        prompt_time = m["prefill_policy"] == "compress-after" and evicts_over_fp8
        for store in ["kivi2", "kivi4"]:
            assert (store in m["kv_cache_dtypes"]) == (
                not m["ops"] or prompt_time or m["evicts_sealed_groups"] or selects_pages), m
    assert methods["vanilla"]["kv_cache_dtypes"] == ["auto", "fp8_e4m3", "kivi2", "kivi4"] + TURBOQUANT
    assert sorted(name for name, m in methods.items() if m["evicts_sealed_groups"]) == ["h2o", "streamingllm"]
    for name in ["snapkv", "pyramidkv", "adakv", "chunkkv", "streamingllm", "h2o"]:
        assert methods[name]["kv_cache_dtypes"] == ["auto", "fp8_e4m3", "kivi2", "kivi4"] + TURBOQUANT, name
    assert methods["quest"]["kv_cache_dtypes"] == ["auto", "fp8_e4m3", "kivi2", "kivi4"]
    # On CUDA (a build with it) FP8 and KIVI pages run under the methods that run there and take them on the CPU, but
    # for page selection, whose ops read them on the CPU only, and KIVI under a method that scores the quantized groups
    # it drops (attention_scores reads them on the CPU only); TurboQuant pages are CPU only.
    cuda_built = "fp8_e4m3" in methods["vanilla"]["cuda_kv_cache_dtypes"]
    on_gpu = ["fp8_e4m3", "kivi2", "kivi4"] if cuda_built else []
    for m in methods.values():
        if not m["cuda_kv_cache_dtypes"]:
            continue  # the method does not run on CUDA
        selects_pages = bool(m["ops"]) and set(m["ops"]) <= PAGE_SELECTION
        scores_groups = m["evicts_sealed_groups"] and "attention_scores" in m["ops"]
        want = ["auto"] + [store for store in on_gpu if store in m["kv_cache_dtypes"] and not selects_pages
                           and not (scores_groups and store.startswith("kivi"))]
        assert m["cuda_kv_cache_dtypes"] == want, m
    assert methods["quest"]["cuda_kv_cache_dtypes"] in ([], ["auto"])
    assert methods["vanilla"]["cuda_kv_cache_dtypes"] == ["auto"] + on_gpu
    assert methods["snapkv"]["cuda_kv_cache_dtypes"] == ["auto"] + on_gpu
    assert methods["streamingllm"]["cuda_kv_cache_dtypes"] == ["auto"] + on_gpu
    assert methods["h2o"]["cuda_kv_cache_dtypes"] == ["auto"] + on_gpu[:1]
    table = run("methods", timeout=60)
    assert "| kv cache dtypes | on cuda |" in table.stdout


@pytest.mark.parametrize("flags, message", [
    (["--kv-cache-dtype", "int3"], "--kv-cache-dtype must be auto, fp8, fp8_e4m3, kivi2, kivi4, turboquant_k8v4, "
                                   "turboquant_4bit_nc, turboquant_k3v4_nc, turboquant_3bit_nc, turboquant_2.5 or "
                                   "turboquant_3.5, got 'int3'"),
    (["--kv-cache-dtype", "turboquant_4bit_nc", "--sparse-method", "kvzip"], "its op subset_attention_max_scores"),
    (["--kv-cache-dtype", "kivi2", "--sparse-method", "rkv"], "cannot run sparse method 'rkv': it evicts or selects"),
    (["--kv-cache-dtype", "kivi4", "--sparse-method", "kvzip"], "its op subset_attention_max_scores reads explicit"),
    (["--kv-cache-dtype", "kivi4", "--kivi-residual", "40"], "must be a positive multiple of the group size 32"),
    (["--kv-cache-dtype", "kivi2", "--kivi-group-size", "24"], "is not a whole number of 2-bit code words"),
    (["--kv-cache-dtype", "fp8", "--sparse-method", "kvzip"], "its op subset_attention_max_scores reads explicit K/V"),
    (["--kv-cache-dtype", "turboquant_3.5", "--sparse-method", "quest"], "its op update_page_key_bounds reads explicit"),
    (["--kv-cache-dtype", "fp8_e4m3", "--sparse-method", "omnikv"], "reads explicit K/V pages only"),
])
def test_a_store_the_method_cannot_take_fails_before_the_model_loads(flags, message):
    # The model path does not exist: the store check must come first, so its error (2) wins over the model's (1).
    r = run("serve", "--port", "0", "--model", "/nonexistent/model.gguf", *flags)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr


@pytest.fixture(scope="module")
def server():
    # StreamingLLM over FP8 pages with a budget above the whole conversation: the chain state holds every token,
    # so resuming it and recomputing the conversation read the same codes.
    s = ServerProcess("--max-model-len", "2048", "--kv-cache-memory", "64MiB", "--kv-cache-dtype", "fp8",
                      "--sparse-method", "streamingllm", "--sparse-config", '{"budget": 1536}')
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_fp8_server_answers_the_openai_client(server, client):
    # The server's first request, so its prompt fixes the FP8 scales as the prompt of a lone `generate` does: both
    # then answer the same text. (SmolLM2-135M does not say "Paris" over FP8 KV: docs/fidelity.md.)
    assert "fp8_e4m3" in server.log_text()
    question = "What is the capital of France?"
    r = client.chat.completions.create(model="default", max_tokens=16, temperature=0,
                                       messages=[{"role": "user", "content": question}])
    answer = r.choices[0].message.content
    assert answer and r.choices[0].finish_reason in ("stop", "length")
    alone = run("generate", "--model", "default", "--chat", "--prompt", question, "--temperature", "0",
                "--max-tokens", "16", "--kv-cache-dtype", "fp8", "--quiet-stats", timeout=300)
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.strip() == answer.strip()


def test_chain_resumed_from_fp8_kv_equals_the_uninterrupted_conversation(client):
    messages = [{"role": "user", "content": "Name three primary colors, one per line."}]
    first = client.chat.completions.create(model="default", messages=messages, max_tokens=16, temperature=0,
                                           extra_body={"chain_id": None})
    chain_id = first.model_extra["chain_id"]
    assert first.model_extra["chain_status"] == "created"
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "Now name one secondary color."}]
    resumed = client.chat.completions.create(model="default", messages=messages, max_tokens=16, temperature=0,
                                             extra_body={"chain_id": chain_id, "chain_append_start": 2})
    assert resumed.model_extra["chain_status"] == "resumed"
    assert resumed.usage.prompt_tokens_details.cached_tokens > 0
    whole = client.chat.completions.create(model="default", messages=messages, max_tokens=16, temperature=0)
    assert resumed.choices[0].message.content == whole.choices[0].message.content


@pytest.mark.parametrize("flags", [
    # The window (R = 32) flushes while the chat prompt is prefilled and again while it decodes.
    ["--kv-cache-dtype", "kivi4", "--kivi-residual", "32"],
    ["--kv-cache-dtype", "turboquant_k3v4_nc"],
    ["--kv-cache-dtype", "turboquant_3.5"],
])
def test_quantized_store_server_answers_the_openai_client(flags):
    s = ServerProcess("--max-model-len", "2048", "--kv-cache-memory", "64MiB", *flags)
    try:
        assert flags[1] in s.log_text()
        client = openai.OpenAI(base_url=s.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
        question = "What is the capital of France?"
        r = client.chat.completions.create(model="default", max_tokens=48, temperature=0,
                                           messages=[{"role": "user", "content": question}])
        answer = r.choices[0].message.content
        assert answer and r.choices[0].finish_reason in ("stop", "length")
    finally:
        s.stop()
    alone = run("generate", "--model", "default", "--chat", "--prompt", question, "--temperature", "0",
                "--max-tokens", "48", "--quiet-stats", *flags, timeout=300)
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.strip() == answer.strip()


def test_snapkv_over_kivi_keeps_its_chain_between_turns():
    # SnapKV keeps 24 of the chat prompt's tokens, KIVI-4 (R = 16) quantizes them, and the second turn of the chain
    # resumes those groups and windows, appending its own tokens as KIVI appends decode tokens.
    s = ServerProcess("--max-model-len", "2048", "--kv-cache-memory", "64MiB", "--kv-cache-dtype", "kivi4",
                      "--kivi-group-size", "16", "--kivi-residual", "16", "--sparse-method", "snapkv",
                      "--sparse-config", '{"budget": 24, "window": 8}')
    try:
        assert "prefix cache chain" in s.log_text()
        client = openai.OpenAI(base_url=s.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
        messages = [{"role": "user", "content": "Name three primary colors, one per line."}]
        first = client.chat.completions.create(model="default", messages=messages, max_tokens=16, temperature=0,
                                               extra_body={"chain_id": None})
        assert first.model_extra["chain_status"] == "created"
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "Now name one secondary color."}]
        resumed = client.chat.completions.create(
            model="default", messages=messages, max_tokens=16, temperature=0,
            extra_body={"chain_id": first.model_extra["chain_id"], "chain_append_start": 2})
        assert resumed.model_extra["chain_status"] == "resumed"
        assert resumed.usage.prompt_tokens_details.cached_tokens > first.usage.prompt_tokens
        assert resumed.choices[0].message.content
    finally:
        s.stop()
