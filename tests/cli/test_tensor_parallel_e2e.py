"""End-to-end tests of --tensor-parallel-size through `generate` on the default model (SmolLM2-135M: 9 attention
heads, 3 KV heads, MLP width 1536, tied embeddings): split over 3 CPU ranks it writes the text one rank writes,
under dense attention and under SnapKV; 2 ranks, which do not divide its heads, are refused at load with the
count that does not divide; every method passes the split check before the model loads."""
import json
import subprocess

from server_process import BINARY, require_default_model

PROMPT = ["--chat", "--prompt", "Name three rivers of Europe and say one thing about each.", "--temperature", "0",
          "--max-tokens", "40", "--quiet-stats", "--device", "cpu"]


def generate(*args, timeout=600):
    return subprocess.run([str(BINARY), "generate", "--model", "default", *PROMPT, *args], capture_output=True,
                          text=True, timeout=timeout)


def test_three_ranks_write_the_text_one_rank_writes():
    require_default_model()
    for method in (["--sparse-method", "vanilla"],
                   ["--sparse-method", "snapkv", "--sparse-config", '{"budget": 24, "window": 8}']):
        one = generate(*method)
        assert one.returncode == 0, one.stderr
        three = generate(*method, "--tensor-parallel-size", "3")
        assert three.returncode == 0, three.stderr
        assert len(one.stdout.split()) > 10, one.stdout
        assert three.stdout == one.stdout, (method, one.stdout, three.stdout)


def test_ranks_that_do_not_divide_the_heads_are_refused_at_load():
    require_default_model()
    two = generate("--tensor-parallel-size", "2", timeout=300)
    assert two.returncode == 1, two.stderr
    assert "tensor parallel size 2 does not divide the model's 9 attention heads" in two.stderr, two.stderr


def test_every_method_runs_split_and_zero_ranks_are_refused():
    # No method refuses more than one rank: each run gets as far as loading the model.
    listed = subprocess.run([str(BINARY), "methods", "--json"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    for method in json.loads(listed.stdout):
        r = subprocess.run([str(BINARY), "generate", "--model", "/nonexistent", "--prompt", "x",
                            "--tensor-parallel-size", "2", "--sparse-method", method["name"]], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 1 and "/nonexistent" in r.stderr, (method["name"], r.stderr)
    zero = subprocess.run([str(BINARY), "generate", "--model", "default", "--prompt", "x", "--tensor-parallel-size",
                           "0"], capture_output=True, text=True, timeout=60)
    assert zero.returncode != 0 and "--tensor-parallel-size" in zero.stderr, zero.stderr
