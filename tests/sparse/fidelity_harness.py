"""Runs a sparse method on synthetic fp32 inputs through method_fidelity_tool (the real SparseController and
cache) and returns what it did, for the per-method oracles in oracles/ to check."""
import json
import os
import pathlib
import subprocess
from dataclasses import dataclass, field

import numpy as np

BUILD_DIR = pathlib.Path(os.environ.get("SE_BUILD_DIR", pathlib.Path(__file__).resolve().parents[2] / "build"))
TOOL = BUILD_DIR / "tests" / "sparse" / "method_fidelity_tool"


@dataclass
class Case:
    """Random post-RoPE q/k/v for every forward step and layer; v[t, h, 0] tags each token with its position."""
    num_layers: int = 2
    num_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int = 64
    page_size: int = 16
    prefill_len: int = 300
    prefill_chunks: list = field(default_factory=list)  # empty: the whole prefill in one step
    decode_steps: int = 0
    seed: int = 0
    q: list = field(default_factory=list)  # [step][layer] arrays
    k: list = field(default_factory=list)
    v: list = field(default_factory=list)
    # Transient passes a method runs in a step's finish_step: {step: [tokens of each pass]}; their q/k/v are
    # pass_q/pass_k/pass_v[step][pass][layer] (v[t, h, 0] = -1 - t: a pass token that stayed would show).
    passes: dict = field(default_factory=dict)
    pass_q: dict = field(default_factory=dict)
    pass_k: dict = field(default_factory=dict)
    pass_v: dict = field(default_factory=dict)
    token_ids: list = field(default_factory=list)  # every step's token ids, flat (empty: all 0)
    encode: dict = None       # {text: ids}: the tokenizer the method sees (None: no tokenizer)
    chat_suffix: str = "\n"
    sliding_windows: list = None  # per layer (0 = full attention); None: every layer full

    def steps(self):
        chunks = self.prefill_chunks or [self.prefill_len]
        assert sum(chunks) == self.prefill_len
        return list(chunks) + [1] * self.decode_steps

    def _random_layers(self, rng, n, tags):
        qs, ks, vs = [], [], []
        for _ in range(self.num_layers):
            qs.append(rng.standard_normal((n, self.num_heads, self.head_dim), dtype=np.float32))
            ks.append(rng.standard_normal((n, self.num_kv_heads, self.head_dim), dtype=np.float32))
            v = rng.standard_normal((n, self.num_kv_heads, self.head_dim), dtype=np.float32)
            v[:, :, 0] = tags[:, None]
            vs.append(v)
        return qs, ks, vs

    def generate(self):
        rng = np.random.default_rng(self.seed)
        position = 0
        for step, n in enumerate(self.steps()):
            qs, ks, vs = self._random_layers(rng, n, np.arange(position, position + n, dtype=np.float32))
            self.q.append(qs)
            self.k.append(ks)
            self.v.append(vs)
            position += n
            for m in self.passes.get(step, []):
                qs, ks, vs = self._random_layers(rng, m, -1 - np.arange(m, dtype=np.float32))
                self.pass_q.setdefault(step, []).append(qs)
                self.pass_k.setdefault(step, []).append(ks)
                self.pass_v.setdefault(step, []).append(vs)
        return self

    def all_keys(self, layer):
        """[T, Hkv, D] keys of `layer` over every step so far, in position order."""
        return np.concatenate([k[layer] for k in self.k], axis=0)

    def all_values(self, layer):
        return np.concatenate([v[layer] for v in self.v], axis=0)

    def prefill_queries(self, layer):
        """[prefill_len, H, D] queries of the prompt at `layer`."""
        n = len(self.prefill_chunks or [self.prefill_len])
        return np.concatenate([q[layer] for q in self.q[:n]], axis=0)


@dataclass
class Result:
    kept: list        # [step][layer][head] -> list of original positions, in stream order
    selected: list    # [step][layer-call] -> None or [head] -> indices
    selection_unit: str
    outputs: list     # [step][layer] -> [n, H, D]
    resident_pages: list
    reported_pages: list
    states: list = field(default_factory=list)  # [step] -> the method's debug_state after the step, or None
    passes: list = field(default_factory=list)  # [step] -> token ids of each transient pass it ran
    pass_peak_pages: list = field(default_factory=list)  # [step] -> most pages held during its passes
    transient_extra_tokens: int = 0  # what the method declares for the prompt


def run(method: str, config: dict, case: Case, tmp_path: pathlib.Path) -> Result:
    data = tmp_path / "case.f32"
    with open(data, "wb") as f:
        for s in range(len(case.steps())):
            for layer in range(case.num_layers):
                for t in (case.q[s][layer], case.k[s][layer], case.v[s][layer]):
                    f.write(np.ascontiguousarray(t, dtype=np.float32).tobytes())
            for p in range(len(case.passes.get(s, []))):
                for layer in range(case.num_layers):
                    for t in (case.pass_q[s][p][layer], case.pass_k[s][p][layer], case.pass_v[s][p][layer]):
                        f.write(np.ascontiguousarray(t, dtype=np.float32).tobytes())
    spec = {"method": method, "config": config, "num_layers": case.num_layers, "num_heads": case.num_heads,
            "num_kv_heads": case.num_kv_heads, "head_dim": case.head_dim, "page_size": case.page_size,
            "steps": case.steps(), "prefill_len": case.prefill_len, "data": str(data),
            "passes": [case.passes.get(s, []) for s in range(len(case.steps()))], "chat_suffix": case.chat_suffix}
    if case.token_ids:
        spec["token_ids"] = [int(t) for t in case.token_ids]
    if case.encode is not None:
        spec["encode"] = case.encode
    if case.sliding_windows is not None:
        spec["sliding_windows"] = case.sliding_windows
    (tmp_path / "case.json").write_text(json.dumps(spec))
    out_path = tmp_path / "out.json"
    # The cases are tiny: one OpenMP thread beats worker threads spinning against each other on a busy machine.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([str(TOOL), str(tmp_path / "case.json"), str(out_path)], check=True, env=env)
    out = json.loads(out_path.read_text())
    raw = np.fromfile(out["outputs"], dtype=np.float32)
    outputs, at = [], 0
    for n in case.steps():
        layers = []
        for _ in range(case.num_layers):
            size = n * case.num_heads * case.head_dim
            layers.append(raw[at:at + size].reshape(n, case.num_heads, case.head_dim))
            at += size
        outputs.append(layers)
    return Result([s["kept"] for s in out["steps"]], [s["selected"] for s in out["steps"]], out["selection_unit"],
                  outputs, out["resident_pages"], out["reported_pages"], [s.get("state") for s in out["steps"]],
                  out.get("passes", []), out.get("pass_peak_pages", []), out.get("transient_extra_tokens", 0))
