"""`bench decode` and its sweep report on the default model (CPU, small sizes): one CSV row per batch whose KV
bytes per step match what dense attention must read, a selection method's metadata counted with them, eviction methods admitted in waves under a small pool, a
batch that cannot stay resident reported as an error row, --max-num-seqs against the batch, and the sweep's report
relating each method to dense."""
import csv
import json
import subprocess
import sys

from server_process import BINARY, SOURCE_DIR, require_default_model

INPUT_LEN, STEPS, WARMUP = 96, 6, 2


def bench_decode(tmp_path, *args, input_len=INPUT_LEN):
    out = tmp_path / "decode.csv"
    r = subprocess.run([str(BINARY), "bench", "decode", "--model", "default", "--input-len", str(input_len),
                        "--steps", str(STEPS), "--warmup-steps", str(WARMUP), "--csv", str(out), *args],
                       capture_output=True, text=True, timeout=600)
    rows = list(csv.DictReader(out.open())) if out.exists() else []
    return r, rows


def model_shape():
    r = subprocess.run([str(BINARY), "inspect", "--model", "default"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    config = json.loads(r.stdout)["config"]
    return config["num_hidden_layers"], config["num_key_value_heads"], config["head_dim"]


def test_dense_rows_read_the_whole_context(tmp_path):
    require_default_model()
    r, rows = bench_decode(tmp_path, "--batch", "1,2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert [int(row["batch"]) for row in rows] == [1, 2]
    layers, kv_heads, head_dim = model_shape()
    for row in rows:
        assert row["method"] == "vanilla" and float(row["decode_tok_s"]) > 0 and float(row["step_ms"]) > 0
        # f32 K and V of every stored token, per layer and KV head; the window's contexts lie between the prompt
        # and the prompt plus every token the sequences can have decoded by its end.
        token_bytes = layers * kv_heads * head_dim * 2 * 4 * int(row["batch"])
        kv_bytes = float(row["kv_gb_per_step"]) * 1e9
        assert INPUT_LEN * token_bytes < kv_bytes < (INPUT_LEN + 400) * token_bytes
        assert float(row["metadata_gb_per_step"]) == 0
        assert 0 < float(row["of_roofline"]) <= 1.5


def test_selection_metadata_joins_the_roofline(tmp_path):
    """Quest's key bounds count with the bytes a step reads: every page of every stream of its ranked layers."""
    require_default_model()
    r, rows = bench_decode(tmp_path, "--batch", "2", "--sparse-method", "quest", "--sparse-config",
                           '{"token_budget": 32}')
    assert r.returncode == 0, r.stdout + r.stderr
    layers, kv_heads, head_dim = model_shape()
    per_page_of_each_stream = (layers - 2) * kv_heads * 2 * (2 * head_dim * 4)  # two sequences; f32 min and max
    metadata = float(rows[0]["metadata_gb_per_step"]) * 1e9
    fewest_pages, most_pages = -(-INPUT_LEN // 16), -(-(INPUT_LEN + 400) // 16)
    assert fewest_pages * per_page_of_each_stream <= metadata <= most_pages * per_page_of_each_stream


def test_snapkv_over_kivi_reads_the_kept_tokens_quantized(tmp_path):
    """SnapKV over KIVI-2 reads, per stream, the quantized key groups of what it kept plus the residual window (not
    a whole prompt's bytes per token: the prompt is six times the budget, mostly quantized)."""
    require_default_model()
    budget, residual, group = 80, 32, 32
    r, rows = bench_decode(tmp_path, "--batch", "1", "--sparse-method", "snapkv", "--sparse-config",
                           json.dumps({"budget": budget, "window": 16}), "--kv-cache-dtype", "kivi2",
                           "--kivi-residual", str(residual), input_len=6 * budget)
    assert r.returncode == 0, r.stdout + r.stderr
    layers, kv_heads, head_dim = model_shape()
    # A 2-bit page of 32 tokens: key and value codes, fp16 scales and minima per key channel and value group.
    page_bytes = 2 * (group * head_dim * 2 // 8) + 2 * 2 * head_dim + 2 * 2 * group * (head_dim // min(group, head_dim))

    def stream_bytes(tokens):
        return tokens // residual * residual // group * page_bytes + min(tokens, residual) * 2 * head_dim * 4

    kv_bytes = float(rows[0]["kv_gb_per_step"]) * 1e9
    # The streams hold the kept prompt and the tokens decoded by the window's end; the CSV rounds to 0.1 MB.
    assert 0.97 * layers * kv_heads * stream_bytes(budget) <= kv_bytes
    assert kv_bytes <= 1.03 * layers * kv_heads * stream_bytes(budget + 64)


def test_eviction_batch_auto_and_an_oversized_batch(tmp_path):
    require_default_model()
    small_pool = ["--kv-cache-memory", "60000000", "--max-num-seqs", "16"]
    r, rows = bench_decode(tmp_path, "--batch", "auto", "--sparse-method", "streamingllm",
                           "--sparse-config", '{"budget": 32}', *small_pool)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(rows) == 1 and int(rows[0]["batch"]) > 1
    auto_batch = int(rows[0]["batch"])
    r, rows = bench_decode(tmp_path, "--batch", str(16 * auto_batch), "--kv-cache-memory", "60000000")
    assert r.returncode == 1
    assert "RESOURCE_EXHAUSTED" in r.stdout


def test_a_batch_above_max_num_seqs_raises_the_default_and_refuses_a_given_one(tmp_path):
    """A batch's sequences decode together: --max-num-seqs follows a batch above its default of 64 (said on stderr),
    and one given below a batch is refused before the model loads."""
    require_default_model()
    r, rows = bench_decode(tmp_path, "--batch", "1,4", "--max-num-seqs", "2")
    assert r.returncode == 2 and not rows
    assert "--max-num-seqs 2 is below --batch 4" in r.stderr, r.stderr
    r, rows = bench_decode(tmp_path, "--batch", "65", input_len=8)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "--max-num-seqs raised from its default 64 to --batch 65" in r.stderr, r.stderr
    assert [int(row["batch"]) for row in rows] == [65]
    # At or below it, nothing is said.
    r, rows = bench_decode(tmp_path, "--batch", "2", "--max-num-seqs", "2", input_len=8)
    assert r.returncode == 0 and "raised" not in r.stderr, r.stderr


def test_a_batch_beyond_what_the_budget_runs_at_once_is_refused(tmp_path):
    """Kara's query rings come out of the KV budget, which then runs fewer sequences at once than --max-num-seqs
    (kv_budget.h): a batch past that is an error row naming the reason, not a smaller batch."""
    require_default_model()
    r, rows = bench_decode(tmp_path, "--batch", "8", "--sparse-method", "kara", "--kv-cache-memory", "200000000",
                           "--max-model-len", "1024", input_len=64)
    assert r.returncode == 1 and not rows
    assert "runs 7 sequences of kara at once, fewer than batch 8" in r.stdout, r.stdout + r.stderr


def test_dense_batch_auto_keeps_what_the_pool_holds(tmp_path):
    # Dense sequences never return pages, so admission must end when the waiting prompts stop fitting rather than
    # wait for every submitted prompt.
    require_default_model()
    small_pool = ["--kv-cache-memory", "20000000", "--max-num-seqs", "16"]
    r, rows = bench_decode(tmp_path, "--batch", "auto", *small_pool)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(rows) == 1 and 1 < int(rows[0]["batch"]) < 16
    assert rows[0]["kv_cache_dtype"] == "auto"


def test_sweep_report_relates_methods_to_dense(tmp_path):
    require_default_model()
    r, _ = bench_decode(tmp_path, "--batch", "1")
    assert r.returncode == 0, r.stderr
    r, _ = bench_decode(tmp_path, "--batch", "1", "--sparse-method", "snapkv", "--sparse-config", '{"budget": 80}')
    assert r.returncode == 0, r.stdout + r.stderr
    report = subprocess.run([sys.executable, str(SOURCE_DIR / "bench" / "decode_sweep.py"), "--report",
                             str(tmp_path / "decode.csv")], capture_output=True, text=True, timeout=60)
    assert report.returncode == 0, report.stderr
    lines = [line for line in report.stdout.splitlines() if line.startswith(f"| {INPUT_LEN} |")]
    assert [line.split("|")[2].strip() for line in lines] == ["vanilla", "snapkv"]
    assert lines[0].rstrip().endswith("| 1.00x |")
