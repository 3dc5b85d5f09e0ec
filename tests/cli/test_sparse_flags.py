"""End-to-end tests of the sparse-method flags of the commands that build an engine (`serve`, `generate`,
`bench throughput`) and of `sparse-engine methods`: bad --sparse-method / --sparse-config values fail fast with
exit code 2 and a message that names them, `methods --json` lists every method of the registry with its traits,
`generate` runs through the engine (streamed, the Paris answer) under every registered method, and a server
started with an explicit method answers requests as before."""
import json
import pathlib
import re
import shutil
import subprocess

import openai
import pytest

from server_process import BINARY, SOURCE_DIR, ServerProcess, require_default_model

FAMILIES = {"dense", "dynamic-selection", "eviction", "quantization", "compression"}
PREFIX_MODES = {"radix", "chain"}
PREFILL_POLICIES = {"dense", "compress-after", "evict-during"}
PARIS_PROMPT = ["--chat", "--prompt", "What is the capital of France?", "--temperature", "0", "--max-tokens", "24"]


def run(*args, timeout=120):
    return subprocess.run([str(BINARY), *args], capture_output=True, text=True, timeout=timeout)


def registry_names():
    """Method names as src/sparse/method_registry.cpp spells them (the oracle for `methods --json`)."""
    text = (SOURCE_DIR / "src" / "sparse" / "method_registry.cpp").read_text()
    return re.findall(r'\{\{"([a-z0-9_]+)",', text)


def methods_json():
    r = run("methods", "--json", timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def method_names():
    """Collected at import: every registered method (empty when the binary is not built)."""
    if not BINARY.exists():
        return []
    return [m["name"] for m in methods_json()]


def first_int_key():
    """(method, key) of the first integer hyperparameter any registered method has, or None."""
    for m in methods_json():
        for key, value in m["defaults"].items():
            if isinstance(value, int) and not isinstance(value, bool):
                return m["name"], key
    return None


# --- methods ---

def test_methods_json_lists_the_registry_with_traits():
    methods = methods_json()
    names = [m["name"] for m in methods]
    assert sorted(names) == sorted(registry_names())
    assert len(set(names)) == len(names)
    assert names[0] == "vanilla"
    for m in methods:
        assert m["family"] in FAMILIES, m
        assert isinstance(m["keeps_full_history"], bool), m
        assert isinstance(m["ops"], list) and all(isinstance(op, str) and op for op in m["ops"]), m
        assert isinstance(m["static_decode_forward"], bool), m
        assert m["prefix_mode"] in PREFIX_MODES, m
        assert m["prefill_policy"] in PREFILL_POLICIES, m
        assert m["selection_unit"] in ("token", "page"), m
        assert isinstance(m["defaults"], dict), m
        assert isinstance(m["summary"], str) and m["summary"], m
        if m["family"] == "eviction":
            assert not m["keeps_full_history"], m  # eviction turns the radix prefix cache off
        # The methods that choose by position alone, or read keys only through logits, keep a latent-attention
        # model's shared latent; the others need per-head K/V.
        over_latent = m["name"] in ("vanilla", "streamingllm", "snapkv", "pyramidkv", "adakv", "chunkkv", "quest")
        assert m["latent_attention_store"] == ("shared latent" if over_latent else "expanded heads"), m
        # On CUDA only vanilla and, in a build with the kernels, StreamingLLM (whose row copies move the latent's
        # rows as bytes) run over it.
        cuda_built = bool(next(x for x in methods if x["name"] == "streamingllm")["cuda_kv_cache_dtypes"])
        expected = m["name"] == "vanilla" or (cuda_built and m["name"] == "streamingllm")
        assert m["latent_attention_on_cuda"] == expected, m
        # Every method decides per KV head or joins the ranks, so all run on tensor-parallel ranks.
        assert m["tensor_parallel"], m
        assert m["composition"] in ("none", "prompt-time", "decode-time"), m
        if m["composition"] != "none":
            assert m["family"] == "eviction", m  # both parts evict; neither narrows what attention reads
    vanilla = methods[0]
    assert vanilla["family"] == "dense" and vanilla["keeps_full_history"] and vanilla["defaults"] == {}


def test_methods_table_names_every_method():
    r = run("methods", timeout=60)
    assert r.returncode == 0, r.stderr
    for name in registry_names():
        assert f"| {name} |" in r.stdout


def compositions():
    """(decode-time names, prompt-time names) as `methods --json` states them."""
    methods = methods_json()
    return ([m["name"] for m in methods if m["composition"] == "decode-time"],
            [m["name"] for m in methods if m["composition"] == "prompt-time"])


def test_methods_table_states_the_valid_compositions():
    decode_time, prompt_time = compositions()
    assert decode_time and prompt_time
    r = run("methods", timeout=60)
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("Compositions:"))
    assert ", ".join(decode_time) in line and ", ".join(prompt_time) in line and "prompt_method" in line, line


def test_methods_list_the_methods_that_run_as_the_partitions():
    partitioned = [m["name"] for m in methods_json() if m["kv_partitions"]]
    # Quest ranks pages, OmniKV filters tokens, ShadowKV picks chunks from its sketch (PartitionConfig).
    assert sorted(partitioned) == ["omnikv", "quest", "shadowkv"]
    r = run("methods", timeout=60)
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("Under --kv-partitions"))
    assert all(name in line for name in partitioned), line


# --- bad flags: exit code 2, one clear line, before the model loads ---

COMMANDS = {
    "serve": ["serve", "--port", "0"],
    "generate": ["generate", "--prompt", "hello"],
    "bench-throughput": ["bench", "throughput", "--num-prompts", "1"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_unknown_method_is_a_usage_error(command):
    # A model path that does not exist: the sparse check must come first, so its error (2) wins over the
    # model's (1).
    r = run(*COMMANDS[command], "--model", "/nonexistent/model.gguf", "--sparse-method", "no_such_method")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: unknown --sparse-method 'no_such_method'")
    assert "vanilla" in lines[0]  # the known methods are listed


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("config, message", [
    ('{"budget": 12', "is not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('"text"', "must be a JSON object"),
])
def test_malformed_sparse_config_is_a_usage_error(command, config, message):
    r = run(*COMMANDS[command], "--model", "/nonexistent/model.gguf", "--sparse-config", config)
    assert r.returncode == 2, r.stderr
    assert "--sparse-config" in r.stderr and message in r.stderr, r.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_unknown_key_is_a_usage_error(command):
    r = run(*COMMANDS[command], "--model", "/nonexistent/model.gguf", "--sparse-method", "vanilla",
            "--sparse-config", '{"no_such_key": 1}')
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "no_such_key" in lines[0], r.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_out_of_range_value_is_a_usage_error(command):
    found = first_int_key()
    if found is None:
        pytest.skip("no registered method has an integer hyperparameter yet")
    method, key = found
    r = run(*COMMANDS[command], "--model", "/nonexistent/model.gguf", "--sparse-method", method,
            "--sparse-config", json.dumps({key: -1_000_000_000}))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "out of range" in lines[0] and key in lines[0], r.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_invalid_composition_is_a_usage_error(command):
    decode_time, prompt_time = compositions()
    methods = methods_json()
    not_prompt_time = next(m["name"] for m in methods if m["composition"] != "prompt-time" and m["name"] != "vanilla")
    cases = [
        (decode_time[0], {"prompt_method": not_prompt_time}, ", ".join(prompt_time)),
        (prompt_time[0], {"prompt_method": prompt_time[0]}, ", ".join(decode_time)),
        (decode_time[0], {"prompt_method": prompt_time[0], "prompt_config": {"no_such_key": 1}}, "no_such_key"),
    ]
    for method, config, words in cases:
        r = run(*COMMANDS[command], "--model", "/nonexistent/model.gguf", "--sparse-method", method,
                "--sparse-config", json.dumps(config))
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {method}: ") and words in lines[0], r.stderr


def test_wrongly_typed_value_is_a_usage_error():
    found = first_int_key()
    if found is None:
        pytest.skip("no registered method has an integer hyperparameter yet")
    method, key = found
    r = run("generate", "--prompt", "x", "--sparse-method", method, "--sparse-config", json.dumps({key: "many"}))
    assert r.returncode == 2 and key in r.stderr and "must be" in r.stderr, r.stderr


# --- generate runs through the engine ---

# Palu's plain SVD (no calibration data for its whitening) at its default half rank loses a quarter of W_v's energy
# in every layer of SmolLM2, which then answers nonsense (docs/quality.md); with its values at full rank (a group of 3
# heads of 64) and its keys at half rank it still answers.
PARIS_CONFIGS = {"palu": {"v_rank": 192}}


@pytest.mark.parametrize("method", method_names())
def test_generate_answers_paris_under_every_method(method):
    require_default_model()
    config = ["--sparse-config", json.dumps(PARIS_CONFIGS[method])] if method in PARIS_CONFIGS else []
    r = run("generate", "--model", "default", *PARIS_PROMPT, "--sparse-method", method, *config, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout, r.stdout
    stats = r.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"\[\d+ prompt tokens in [\d.]+ s, \d+ generated at [\d.]+ tok/s, finish: (stop|length), "
                        rf"sparse method {method}\]", stats), stats


def test_generate_streams_and_honours_engine_flags():
    require_default_model()
    r = run("generate", "--model", "default", "--prompt", "The capital of France is", "--temperature", "0",
            "--max-tokens", "8", "--ignore-eos", "--max-model-len", "256", "--page-size", "8",
            "--max-num-batched-tokens", "4", "--quiet-stats", timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout and r.stderr == ""
    too_long = run("generate", "--model", "default", "--prompt", "hello", "--max-tokens", "64", "--max-model-len", "32",
                   timeout=300)
    assert too_long.returncode == 1 and "maximum context length is 32" in too_long.stderr, too_long.stderr


# --- serve with an explicit method: requests are unchanged ---

def test_serve_with_an_explicit_method_answers_as_before():
    s = ServerProcess("--max-model-len", "1024", "--sparse-method", "vanilla", "--sparse-config", "{}")
    try:
        assert "sparse method vanilla" in s.log_text()
        client = openai.OpenAI(base_url=s.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
        assert [m.id for m in client.models.list().data] == ["default"]
        r = client.chat.completions.create(model="default", max_tokens=16, temperature=0,
                                           messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in r.choices[0].message.content
    finally:
        s.stop()


def test_device_flag_falls_back_to_the_cpu_and_refuses_a_missing_gpu():
    require_default_model()
    if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi"], capture_output=True).returncode == 0:
        pytest.skip("a GPU is visible: --device auto picks it")
    for device in ([], ["--device", "auto"], ["--device", "cpu"]):
        r = run("generate", "--model", "default", "--prompt", "Hi", "--max-tokens", "2", *device)
        assert r.returncode == 0, r.stderr
    r = run("generate", "--model", "default", "--prompt", "Hi", "--max-tokens", "2", "--device", "cuda")
    assert r.returncode == 2
    assert "no CUDA device is visible" in r.stderr or "no CUDA backend" in r.stderr, r.stderr
    assert run("generate", "--model", "default", "--device", "tpu").returncode == 2
