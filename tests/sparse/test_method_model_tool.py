"""method_model_tool (sparse methods on a real model, kept positions recovered from the stored keys) and the
budget mapping / comparison logic of tools/kvpress_compare.py, on a tiny random Llama checkpoint written with
numpy. The kvpress run itself needs torch and a GPU machine (docs/fidelity.md); here only what it relies on."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import kvpress_compare as kc  # noqa: E402

BUILD_DIR = pathlib.Path(os.environ.get("SE_BUILD_DIR", ROOT / "build"))
TOOL = BUILD_DIR / "tests" / "sparse" / "method_model_tool"
DIMS = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, intermediate_size=128)
T = 160


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    kc.make_checkpoint(d, seed=3, qk_std=0.25, **DIMS)
    return d


def run_tool(checkpoint, tmp_path, runs, prompts, **extra):
    request = {"prompts": prompts, "runs": runs, **extra}
    (tmp_path / "req.json").write_text(json.dumps(request))
    subprocess.run([str(TOOL), str(checkpoint), str(tmp_path / "req.json"), str(tmp_path / "out.json")], check=True)
    return json.loads((tmp_path / "out.json").read_text())


@pytest.fixture(scope="module")
def prompts():
    import numpy as np
    rng = np.random.default_rng(7)
    return [rng.integers(3, DIMS["vocab_size"], size=T).tolist(), rng.integers(3, DIMS["vocab_size"], size=97).tolist()]


def test_streamingllm_and_snapkv_kept_positions(checkpoint, tmp_path, prompts):
    runs = [{"method": "streamingllm", "config": {"budget": 40, "sink_tokens": 4}, "prompt": 0},
            {"method": "snapkv", "config": {"budget": 50, "window": 16, "kernel": 5}, "prompt": 0},
            {"method": "vanilla", "config": {}, "prompt": 1},
            {"method": "chunkkv", "config": {"budget": 60, "window": 16, "chunk_length": 10}, "prompt": 0}]
    out = run_tool(checkpoint, tmp_path, runs, prompts)
    assert out["model"]["num_layers"] == 2 and out["model"]["num_kv_heads"] == 2
    assert len(out["prompt_logits"]) == 2 and len(out["prompt_logits"][0]) == DIMS["vocab_size"]
    stream, snap, dense, chunk = out["runs"]
    for r in out["runs"]:
        assert r["resident_pages"] == r["reported_pages"]
    assert all(h == list(range(4)) + list(range(T - 36, T)) for layer in stream["kept"] for h in layer)
    assert all(h == list(range(97)) for layer in dense["kept"] for h in layer)
    heads = [h for layer in snap["kept"] for h in layer]
    assert all(len(h) == 50 and h == sorted(h) and h[-16:] == list(range(T - 16, T)) for h in heads)
    assert len({tuple(h) for h in heads}) > 1  # real scores: streams choose differently
    for layer in chunk["kept"]:
        assert layer[0] == layer[1]  # ChunkKV: the same chunks for every KV head
        assert len(layer[0]) == 60 and len({j // 10 for j in layer[0]}) == 6


@pytest.mark.parametrize("method", ["streamingllm", "h2o"])
def test_a_prompt_one_token_over_the_budget_compacts_in_prompt_order(method, checkpoint, tmp_path, prompts):
    """Only a decode step refills the evicted slot with its new token; a prefill that ends one token over the
    budget keeps its rows in prompt order."""
    budget = T - 1
    out = run_tool(checkpoint, tmp_path, [{"method": method, "config": {"budget": budget}, "prompt": 0}], prompts)
    heads = [h for layer in out["runs"][0]["kept"] for h in layer]
    assert all(len(h) == budget and h == sorted(h) for h in heads)


def test_kvzip_keeps_the_matched_number_of_pairs(checkpoint, tmp_path, prompts):
    L, Hkv = DIMS["num_hidden_layers"], DIMS["num_key_value_heads"]
    plan = kc.make_plan(checkpoint, lengths=[T], ratios=[0.6])
    run = next(r for r in plan["runs"] if r["case"] == "kvzip")
    _, num_context_kept = kc.kvzip_our_ratio(T, 0.6, L, Hkv)
    out = run_tool(checkpoint, tmp_path, [dict(run, prompt=0)], [prompts[0]], encode=plan["encode"],
                   chat_suffix=plan["chat_suffix"])
    kept = out["runs"][0]["kept"]
    assert all(h[:4] == [0, 1, 2, 3] for layer in kept for h in layer)
    assert sum(len(h) - 4 for layer in kept for h in layer) == num_context_kept
    assert len({len(h) for layer in kept for h in layer}) > 1  # one global threshold: heads differ


@pytest.mark.parametrize("T", [65, 300, 777, 1337, 2000, 4097])
@pytest.mark.parametrize("r", [0.1, 0.3, 0.5, 0.75, 0.9])
def test_budget_mapping(T, r):
    assert kc.n_kept(T, r) == max(1, int(T * (1 - r)))
    assert kc.chunks_kept(T, r) == max(1, int(-(-T // 20) * (1 - r)))
    for L, Hkv in ((4, 2), (32, 8)):
        ratio, K = kc.kvzip_our_ratio(T, r, L, Hkv)
        N = L * Hkv * (T - 4)
        assert int(N * ratio) - 1 == K == L * Hkv * T - int(L * Hkv * T * r) - 4 * L * Hkv


def test_compare_logic_on_fake_runs():
    plan = {"prompts": [[0] * 10], "runs": [
        {"case": "a", "method": "snapkv", "prompt": 0, "ratio": 0.5, "config": {"budget": 5}, "press": {"name": "X"}},
        {"case": "b", "method": "adakv", "prompt": 0, "ratio": 0.5, "config": {"budget": 5}, "press": {"name": "Y"}}]}
    ours = {"runs": [{"method": "snapkv", "prompt": 0, "kept": [[[0, 1, 2], [3, 4]]]},
                     {"method": "adakv", "prompt": 0, "kept": [[[0, 1], [5, 6, 7]]]}]}
    theirs = {"runs": [{"case": "a", "prompt": 0, "ratio": 0.5, "kept": [[[0, 1, 2], [3, 5]]]},
                       {"case": "b", "prompt": 0, "ratio": 0.5, "kept": [[[0, 1, 9], [5, 6]]]},
                       {"case": "c", "prompt": 0, "ratio": 0.5, "error": "boom"}]}
    summary = {s["case"]: s for s in kc.summarize(kc.compare_runs(plan, ours, theirs))}
    assert summary["a"]["exact_rate"] == 0.5 and summary["a"]["nested_rate"] == 0.5
    assert summary["a"]["mean_jaccard"] == pytest.approx((1 + 1 / 3) / 2)
    assert summary["b"]["exact_rate"] == 0 and summary["b"]["nested_rate"] == 1.0
    assert summary["b"]["count_rate"] == 0
    assert "| a |" in kc.markdown_table(list(summary.values()))
