"""`bench throughput` as the long-generation benchmark on the default model (CPU, small sizes): its argument checks,
CSV rows whose counts add up (every request writes exactly its output, preempted or not; a dense run frees no pages,
a Kara run frees whole pages of every stream), a pool small enough that dense sequences are preempted (and, under
peak admission, take turns unpreempted), and the
sweep's report relating Kara to dense at each concurrency, and a --max-num-seqs below the concurrency kept as vLLM keeps
it."""
import csv
import json
import subprocess
import sys

from server_process import BINARY, SOURCE_DIR, require_default_model

INPUT_LEN, OUTPUT_LEN, REQUESTS, CONCURRENCY = 32, 96, 3, 2
KARA = {"window": 32, "buffer": 16, "period": 16, "candidates": 8, "budget": 16}


def bench_throughput(tmp_path, *args, output_len=OUTPUT_LEN):
    out = tmp_path / "throughput.csv"
    r = subprocess.run([str(BINARY), "bench", "throughput", "--model", "default", "--input-len", str(INPUT_LEN),
                        "--output-len", str(output_len), "--num-prompts", str(REQUESTS), "--csv", str(out), *args],
                       capture_output=True, text=True, timeout=600)
    rows = list(csv.DictReader(out.open())) if out.exists() else []
    return r, rows


def model_streams():
    r = subprocess.run([str(BINARY), "inspect", "--model", "default"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    config = json.loads(r.stdout)["config"]
    return config["num_hidden_layers"] * config["num_key_value_heads"]


def test_bad_arguments_stop_with_a_usage_error(tmp_path):
    require_default_model()
    for args, words in [(["--concurrency", "-1"], "--concurrency -1"),
                        (["--sparse-method", "nosuch"], "nosuch"), (["--admission", "lazy"], "--admission")]:
        r, rows = bench_throughput(tmp_path, *args)
        assert r.returncode == 2, r.stdout + r.stderr
        assert words in r.stderr and not rows
    r, rows = bench_throughput(tmp_path, output_len=1 << 20)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "exceeds the context" in r.stderr and not rows


def test_rows_count_every_token_and_the_pages_compression_freed(tmp_path):
    require_default_model()
    streams = model_streams()
    r, rows = bench_throughput(tmp_path, "--concurrency", str(CONCURRENCY))
    assert r.returncode == 0, r.stdout + r.stderr
    r, rows = bench_throughput(tmp_path, "--concurrency", str(CONCURRENCY), "--sparse-method", "kara",
                               "--sparse-config", json.dumps(KARA))
    assert r.returncode == 0, r.stdout + r.stderr
    dense, kara = rows
    for row in rows:
        assert int(row["output_tokens"]) == REQUESTS * OUTPUT_LEN
        assert int(row["concurrency"]) == CONCURRENCY and int(row["num_prompts"]) == REQUESTS
        assert float(row["output_tok_s"]) > 0 and int(row["preemptions"]) == 0
        assert 0 < int(row["kv_pages_peak"]) <= int(row["kv_pages_total"])
    # Dense: nothing freed; at its peak two sequences hold every token they have.
    assert dense["method"] == "vanilla" and int(dense["compression_steps"]) == 0
    assert int(dense["compression_freed_pages"]) == 0
    pages_per_sequence = streams * -(-(INPUT_LEN + OUTPUT_LEN) // 16)
    assert pages_per_sequence <= int(dense["kv_pages_peak"]) <= CONCURRENCY * pages_per_sequence
    # Kara: each of the first two windows of every request (at 48 and 80 decoded tokens) keeps 16 of its 32 tokens,
    # one page of every stream.
    assert kara["method"] == "kara" and json.loads(kara["sparse_config"])["budget"] == 16
    assert int(kara["compression_freed_pages"]) == REQUESTS * 2 * streams
    assert REQUESTS <= int(kara["compression_steps"]) <= REQUESTS * 2
    assert 0 < float(kara["compression_share"]) < 1
    assert int(kara["kv_pages_peak"]) < int(dense["kv_pages_peak"])

    report = subprocess.run([sys.executable, str(SOURCE_DIR / "bench" / "long_generation_sweep.py"), "--report",
                             str(tmp_path / "throughput.csv")], capture_output=True, text=True, timeout=60)
    assert report.returncode == 0, report.stderr
    ratios = [line for line in report.stdout.splitlines() if line.startswith(f"| {CONCURRENCY} | ")][-1]
    kara_over_dense = float(kara["output_tok_s"]) / float(dense["output_tok_s"])
    assert ratios.split("|")[4].strip() == f"{kara_over_dense:.2f}x", report.stdout


def test_a_small_pool_preempts_dense_sequences_and_every_token_still_counts(tmp_path):
    require_default_model()
    # About 1,460 pages: three prompts fit, three whole sequences (720 pages each) do not.
    r, rows = bench_throughput(tmp_path, "--concurrency", str(REQUESTS), "--kv-cache-memory", "12000000")
    assert r.returncode == 0, r.stdout + r.stderr
    row = rows[0]
    assert row["admission"] == "optimistic" and int(row["preemptions"]) > 0
    assert int(row["output_tokens"]) == REQUESTS * OUTPUT_LEN
    assert int(row["kv_pages_peak"]) <= int(row["kv_pages_total"]) < REQUESTS * model_streams() * 8
    # Peak admission starts a sequence only where its whole length fits beside the running ones: they take turns,
    # none is preempted, and every token is still written.
    r, rows = bench_throughput(tmp_path, "--concurrency", str(REQUESTS), "--kv-cache-memory", "12000000",
                               "--admission", "peak")
    assert r.returncode == 0, r.stdout + r.stderr
    row = rows[1]
    assert row["admission"] == "peak" and int(row["preemptions"]) == 0
    assert int(row["output_tokens"]) == REQUESTS * OUTPUT_LEN


def test_a_smaller_max_num_seqs_stays_and_the_requests_past_it_wait(tmp_path):
    require_default_model()
    r, rows = bench_throughput(tmp_path, "--concurrency", str(REQUESTS), "--max-num-seqs", "1", output_len=8)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"--max-num-seqs 1 runs at most 1 of the {REQUESTS} requests in flight at once" in r.stderr, r.stderr
    assert f"concurrency {REQUESTS} (1 running at most)" in r.stdout, r.stdout
    row = rows[0]
    assert int(row["concurrency"]) == REQUESTS and int(row["output_tokens"]) == REQUESTS * 8
    # At or above the concurrency it says nothing.
    r, rows = bench_throughput(tmp_path, "--concurrency", str(REQUESTS), "--max-num-seqs", str(REQUESTS), output_len=8)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "runs at most" not in r.stderr and f"({REQUESTS} running at most)" in r.stdout
