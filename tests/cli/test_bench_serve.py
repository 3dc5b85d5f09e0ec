"""End-to-end test of `sparse-engine bench serve` against a real `sparse-engine serve`."""
import json
import subprocess

from server_process import BINARY, ServerProcess


def test_bench_serve_reports_every_request(tmp_path):
    s = ServerProcess("--max-model-len", "512", "--served-model-name", "smol")
    try:
        result = tmp_path / "result.json"
        run = subprocess.run([str(BINARY), "bench", "serve", "--port", str(s.port), "--num-prompts", "12",
                              "--input-len", "24", "--output-len", "5", "--request-rate", "20",
                              "--max-concurrency", "4", "--result-json", str(result)],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "Serving Benchmark Result" in run.stdout
        r = json.loads(result.read_text())
        assert r["model"] == "smol"  # found through /v1/models
        assert r["completed"] == 12 and r["failed"] == 0
        assert r["total_input_tokens"] == 12 * 24
        assert r["total_output_tokens"] == 12 * 5
        assert r["request_throughput"] > 0 and r["output_throughput"] > 0
        for key in ("ttft", "tpot", "itl"):
            assert 0 < r[f"mean_{key}_ms"] and r[f"median_{key}_ms"] <= r[f"p99_{key}_ms"]

        unreachable = subprocess.run([str(BINARY), "bench", "serve", "--port", "1", "--num-prompts", "1"],
                                     capture_output=True, text=True, timeout=60)
        assert unreachable.returncode == 1
        assert "cannot reach" in unreachable.stderr
    finally:
        s.stop()


def test_serve_rejects_bad_flags():
    bad_size = subprocess.run([str(BINARY), "serve", "--kv-cache-memory", "lots"], capture_output=True, text=True,
                              timeout=60)
    assert bad_size.returncode == 2
    assert "'lots' is not a byte size" in bad_size.stderr + bad_size.stdout
