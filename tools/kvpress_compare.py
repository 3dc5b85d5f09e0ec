#!/usr/bin/env python3
"""Compares our eviction methods with NVIDIA kvpress on one small random Llama checkpoint and the same token ids.

Subcommands (the first three and the last need numpy only; `kvpress` needs torch, transformers and kvpress):
  checkpoint DIR      writes a seeded random Llama-architecture checkpoint (config.json + model.safetensors, fp32)
                      that both our loader and transformers load
  plan DIR PLAN.json  the prompts (seeded random token ids) and, per case, our method + config and the kvpress
                      press + compression ratio with matched budgets; PLAN.json is also the request of
                      tests/sparse/method_model_tool (it reads "prompts", "runs", "encode", "chat_suffix")
  kvpress DIR PLAN.json OUT.json [--device cuda] [--dtype float32]
                      runs every press of the plan with transformers and records the kept positions per (layer,
                      KV head): pruning presses through their `compress` (input rows matched to output rows),
                      AdaKV and KVzip through the `masked_key_indices` they leave on each attention module
  compare PLAN.json OURS.json KVPRESS.json [--reference KVPRESS64.json] [--markdown OUT.md] [--json OUT.json]
                      per case, prompt and (layer, KV head): exact set equality, Jaccard, nesting (one set inside
                      the other, i.e. the same ranking with different counts) and kept counts

The budget mapping (METHODS.md "Budget semantics"): kvpress keeps n_kept = max(1, int(T (1 - r))) tokens per head,
window included; our `budget` is the same count, so most methods (AdaKV included) get budget = n_kept. PyramidKV's
kvpress schedule works from the real T (1 - r) instead, so pyramidkv gets budget = T * (1 - r), the same double
(a JSON float; its kvpress schedule accepts fractional budgets). ChunkKV keeps max(1, int(ceil(T / 20) (1 - r)))
chunks; our budget is that many chunks times 20. KVzip prunes int(L Hkv T r) pairs globally, sinks scored above
all; our `ratio` is chosen so that our strict threshold keeps exactly the same number of context pairs. PyramidKV
and AdaKV run with their defaults (schedule / variant kvpress, kvpress's scorer); only pyramidkv-w8 sets a window.

Our own code; kvpress is only imported (never copied).
"""
import argparse
import json
import pathlib
import platform
import struct
import sys
import time
import types

import numpy as np

# --------------------------------------------------------------------------------------------------------------
# Checkpoint
# --------------------------------------------------------------------------------------------------------------

DEFAULT_DIMS = dict(vocab_size=1024, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                    num_key_value_heads=2, head_dim=32, intermediate_size=512)


def write_safetensors(path, tensors):
    """tensors: {name: float32 ndarray}; the safetensors layout (8-byte header size, JSON header, raw data)."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        blobs.append(a.tobytes())
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def make_checkpoint(out_dir, seed=0, qk_std=0.125, **dims):
    """A random Llama. q_proj/k_proj use std qk_std (logit std ~ hidden * qk_std^2 = 4 at the defaults), so the
    attention is peaked rather than uniform; everything else is scaled to keep the residual stream O(1)."""
    d = dict(DEFAULT_DIMS, **dims)
    rng = np.random.default_rng(seed)
    hidden, inter, hd = d["hidden_size"], d["intermediate_size"], d["head_dim"]
    nh, nkv, vocab = d["num_attention_heads"], d["num_key_value_heads"], d["vocab_size"]

    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    t = {"model.embed_tokens.weight": normal((vocab, hidden), 1.0),
         "model.norm.weight": (1.0 + normal((hidden,), 0.1)),
         "lm_head.weight": normal((vocab, hidden), hidden ** -0.5)}
    for i in range(d["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1.0 + normal((hidden,), 0.1)
        t[p + "post_attention_layernorm.weight"] = 1.0 + normal((hidden,), 0.1)
        t[p + "self_attn.q_proj.weight"] = normal((nh * hd, hidden), qk_std)
        t[p + "self_attn.k_proj.weight"] = normal((nkv * hd, hidden), qk_std)
        t[p + "self_attn.v_proj.weight"] = normal((nkv * hd, hidden), hidden ** -0.5)
        t[p + "self_attn.o_proj.weight"] = normal((hidden, nh * hd), (nh * hd) ** -0.5)
        t[p + "mlp.gate_proj.weight"] = normal((inter, hidden), hidden ** -0.5)
        t[p + "mlp.up_proj.weight"] = normal((inter, hidden), hidden ** -0.5)
        t[p + "mlp.down_proj.weight"] = normal((hidden, inter), inter ** -0.5)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", **d,
        "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
        "tie_word_embeddings": False, "initializer_range": 0.02, "use_cache": True, "bos_token_id": 1,
        "eos_token_id": 2, "torch_dtype": "float32",
    }
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    write_safetensors(out / "model.safetensors", t)
    return config


# --------------------------------------------------------------------------------------------------------------
# Plan: prompts and matched cases
# --------------------------------------------------------------------------------------------------------------

PROMPT_LENGTHS = [300, 777, 1337, 2000]
RATIOS = [0.5, 0.75]
WINDOW, KERNEL, CHUNK = 64, 5, 20
# KVzip's instruction strings as kvpress and our method ask the tokenizer for them. Neither side gets a real
# tokenizer here: both see this table (kvpress through a stand-in tokenizer, ours through MethodEnvironment).
KVZIP_FIRST = "\n\nRepeat the previous context exactly."
KVZIP_NEXT_OURS = "\n\nRepeat the part of the previous context exactly, starting with "
KVZIP_NEXT_KVPRESS = KVZIP_NEXT_OURS.rstrip(" ")
CHAT_PREFIX, CHAT_SUFFIX = "<PREFIX>", "<SUFFIX>"
N_SINK = 4


def n_kept(T, r):
    """kvpress compute_n_kept."""
    return 0 if r >= 1.0 else max(1, int(T * (1 - r)))


def pyramid_budget(T, r):
    """kvpress PyramidKVPress's per-layer average T (1 - r), computed as kvpress computes it (our pyramidkv budget)."""
    return T * (1 - r)


def chunks_kept(T, r, c=CHUNK):
    """kvpress ChunkKVPress: max(1, int(n_chunks (1 - r))) chunks, the partial one counted."""
    return max(1, int((T // c + (T % c > 0)) * (1 - r)))


def kvzip_our_ratio(T, r, num_layers, num_kv_heads, n_sink=N_SINK):
    """Our kvzip `ratio` whose strict threshold keeps exactly the context pairs kvpress keeps.
    kvpress: prunes int(M T r) of M T scores (M = layers x KV heads), the M n_sink sinks scored above all;
    ours: keeps int(N ratio) - 1 of the N = M (T - n_sink) context pairs."""
    M = num_layers * num_kv_heads
    K = M * T - int(M * T * r) - M * n_sink  # context pairs kvpress keeps
    N = M * (T - n_sink)
    ratio = (K + 1.5) / N
    assert int(N * ratio) == K + 1 and 0 < ratio <= 1, (T, r, K, N, ratio)
    return ratio, K


def make_plan(checkpoint_dir, seed=1234, lengths=None, ratios=None):
    config = json.loads((pathlib.Path(checkpoint_dir) / "config.json").read_text())
    L, Hkv, V = config["num_hidden_layers"], config["num_key_value_heads"], config["vocab_size"]
    lengths = lengths or PROMPT_LENGTHS
    ratios = ratios or RATIOS
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, V, size=T).tolist() for T in lengths]
    snap = {"window": WINDOW, "kernel": KERNEL, "pooling": "avgpool", "gqa_agg": "mean",
            "gqa_order": "pool_then_reduce"}
    runs, skipped = [], []

    def add(case, method, config_, press, prompt, r, note=None):
        runs.append({"case": case, "method": method, "config": config_, "press": press, "prompt": prompt,
                     "ratio": r, **({"note": note} if note else {})})

    for p, T in enumerate(lengths):
        for r in ratios:
            k = n_kept(T, r)
            add("streamingllm", "streamingllm", {"budget": k, "sink_tokens": N_SINK},
                {"name": "StreamingLLMPress", "compression_ratio": r, "n_sink": N_SINK}, p, r)
            snap_press = {"name": "SnapKVPress", "compression_ratio": r, "window_size": WINDOW,
                          "kernel_size": KERNEL}
            if k <= WINDOW:
                skipped.append(f"T={T} r={r}: n_kept={k} <= window {WINDOW} (our budget must exceed the window)")
            else:
                add("snapkv", "snapkv", dict(budget=k, **snap), snap_press, p, r)
                add("adakv", "adakv", {"budget": k},  # the defaults: variant kvpress, SnapKVPress's scorer, alpha 0.2
                    {"name": "AdaKVPress", "alpha_safeguard": 0.2, "press": snap_press}, p, r)
            pyramid = pyramid_budget(T, r)
            if pyramid <= WINDOW:
                skipped.append(f"pyramidkv T={T} r={r}: budget {pyramid} <= window {WINDOW}")
            else:  # the defaults: schedule kvpress, beta 20, window 64, kernel 5, avgpool
                add("pyramidkv", "pyramidkv", {"budget": pyramid},
                    {"name": "PyramidKVPress", "compression_ratio": r, "window_size": WINDOW,
                     "kernel_size": KERNEL, "beta": 20}, p, r)
            add("pyramidkv-w8", "pyramidkv", {"budget": pyramid, "window": 8},
                {"name": "PyramidKVPress", "compression_ratio": r, "window_size": 8, "kernel_size": KERNEL,
                 "beta": 20}, p, r)
            nc = chunks_kept(T, r)
            if nc * CHUNK <= WINDOW:
                skipped.append(f"chunkkv T={T} r={r}: {nc} chunks = {nc * CHUNK} tokens <= window {WINDOW}")
            else:
                add("chunkkv", "chunkkv", dict(budget=nc * CHUNK, chunk_length=CHUNK, **snap),
                    {"name": "ChunkKVPress", "chunk_length": CHUNK, "press": snap_press}, p, r)
            ratio, K = kvzip_our_ratio(T, r, L, Hkv)
            add("kvzip", "kvzip", {"ratio": ratio, "n_sink": N_SINK, "chunk_size": 2048, "level": "pair"},
                {"name": "KVzipPress", "compression_ratio": r, "n_sink": N_SINK, "chunk_size": 2048,
                 "layerwise": False}, p, r, note=f"{K} context pairs kept")
    ids = iter(range(V - 1, 0, -1))  # token ids standing for the instruction strings
    encode = {KVZIP_FIRST: [next(ids) for _ in range(9)], KVZIP_NEXT_OURS: [next(ids) for _ in range(12)],
              CHAT_SUFFIX: [next(ids) for _ in range(3)], CHAT_PREFIX: [next(ids) for _ in range(N_SINK)]}
    encode[KVZIP_NEXT_KVPRESS] = encode[KVZIP_NEXT_OURS]
    return {"checkpoint": config, "page_size": 16, "prompts": prompts, "lengths": lengths, "runs": runs,
            "skipped": skipped, "encode": encode, "chat_suffix": CHAT_SUFFIX, "chat_prefix": CHAT_PREFIX}


# --------------------------------------------------------------------------------------------------------------
# kvpress side (device)
# --------------------------------------------------------------------------------------------------------------

def _stub_missing_modules():
    """kvpress/__init__ imports every press; a few import packages the presses compared here never use
    (datasets, cachetools, fire, requests). Stand-ins are installed only when a package is absent."""
    import importlib.util
    stubbed = []
    if importlib.util.find_spec("datasets") is None:
        m = types.ModuleType("datasets")
        m.load_dataset = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("datasets stub"))
        sys.modules["datasets"] = m
        stubbed.append("datasets")
    if importlib.util.find_spec("cachetools") is None:
        m = types.ModuleType("cachetools")
        m.LRUCache = lambda *a, **k: {}
        m.cached = lambda *a, **k: (lambda f: f)
        sys.modules["cachetools"] = m
        stubbed.append("cachetools")
    if importlib.util.find_spec("requests") is None:
        sys.modules["requests"] = types.ModuleType("requests")
        stubbed.append("requests")
    if importlib.util.find_spec("fire") is None:
        m = types.ModuleType("fire")
        m.Fire = lambda *a, **k: None
        sys.modules["fire"] = m
        stubbed.append("fire")
    return stubbed


class _TableTokenizer:
    """What KVzipPress asks of AutoTokenizer.from_pretrained(...): encode() of the instruction strings and a chat
    template whose prefix is N_SINK tokens (so kvpress's prefix_length equals our n_sink) and whose reply suffix is
    CHAT_SUFFIX, all through the plan's table, as our method sees them through MethodEnvironment."""

    chat_template = "table"

    def __init__(self, table):
        self.table = table

    def apply_chat_template(self, messages, **kwargs):
        return CHAT_PREFIX + messages[-1]["content"] + CHAT_SUFFIX

    def encode(self, text, return_tensors=None, add_special_tokens=False):
        import torch
        ids = self.table[text]
        return torch.tensor([ids], dtype=torch.long) if return_tensors == "pt" else list(ids)


def _match_rows(before, after):
    """before [T, D], after [n, D] (one head): the index in `before` of every row of `after` (exact match)."""
    eq = (after[:, None, :] == before[None, :, :]).all(-1)  # [n, T]
    if not bool(eq.any(1).all()):
        raise RuntimeError("a compressed key row matches no input row")
    return eq.int().argmax(1).tolist()


def run_kvpress(checkpoint_dir, plan, device="cuda", dtype="float32", cases=None):
    stubbed = _stub_missing_modules()
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, DynamicCache
    import kvpress
    from kvpress.presses import kvzip_press as kvzip_module

    torch.set_float32_matmul_precision("highest")  # no TF32 anywhere: fp32 means fp32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch_dtype = getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(checkpoint_dir, dtype=torch_dtype,
                                                 attn_implementation="sdpa").to(device).eval()
    layers = model.model.layers
    shims = set()

    def build(spec):
        spec = dict(spec)
        cls = getattr(kvpress, spec.pop("name"))
        if "press" in spec:
            spec["press"] = build(spec["press"])
        return cls(**spec)

    def instrument(press, kept):
        """Records kept rows of pruning presses; adds cache_position where the installed transformers no longer
        passes it to attention (kvpress 0.5.5 targets transformers < 5.3; BasePress.forward_hook reads it)."""
        inner_compress = press.compress

        def compress(module, hidden_states, keys, values, attentions, kwargs):
            k2, v2 = inner_compress(module, hidden_states, keys, values, attentions, kwargs)
            if k2.shape[2] != keys.shape[2]:
                kept[int(module.layer_idx)] = [_match_rows(keys[0, h], k2[0, h]) for h in range(keys.shape[1])]
            return k2, v2

        press.compress = compress
        inner_hook = press.forward_hook

        def forward_hook(module, args, kwargs, output):
            if "cache_position" not in kwargs:
                q_len = kwargs["hidden_states"].shape[1]
                pos = kwargs.get("position_ids")
                if pos is not None:
                    cache_position = pos[0]
                else:
                    length = kwargs["past_key_values"].get_seq_length(module.layer_idx)
                    cache_position = torch.arange(length - q_len, length, device=kwargs["hidden_states"].device)
                kwargs = dict(kwargs, cache_position=cache_position)
                shims.add("cache_position")
            return inner_hook(module, args, kwargs, output)

        press.forward_hook = forward_hook

    kvzip_module.AutoTokenizer = types.SimpleNamespace(from_pretrained=lambda *a, **k: _TableTokenizer(plan["encode"]))

    results, prompt_logits = [], []
    with torch.no_grad():
        for ids in plan["prompts"]:
            x = torch.tensor([ids], device=device)
            logits = model(input_ids=x, logits_to_keep=1).logits[0, -1].float().cpu().tolist()
            prompt_logits.append(logits)
        for run in plan["runs"]:
            if cases and run["case"] not in cases:
                continue
            ids = plan["prompts"][run["prompt"]]
            T = len(ids)
            press = build(run["press"])
            kept = {}
            instrument(press, kept)
            for layer in layers:
                layer.self_attn.masked_key_indices = None
            cache = DynamicCache(config=model.config)
            x = torch.tensor([ids], device=device)
            start = time.time()
            try:
                with press(model):
                    model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=1)
            except Exception as e:  # noqa: BLE001 - recorded; e.g. KVzipPress builds an fp32 mask in fp64 runs
                results.append({"case": run["case"], "prompt": run["prompt"], "ratio": run["ratio"],
                                "press": run["press"], "num_tokens": T, "error": f"{type(e).__name__}: {e}"})
                print(f"{run['case']} T={T} r={run['ratio']}: {results[-1]['error']}", file=sys.stderr)
                continue
            elapsed = time.time() - start
            out = []
            for li, layer in enumerate(layers):
                masked = getattr(layer.self_attn, "masked_key_indices", None)
                num_kv_heads = model.config.num_key_value_heads
                if masked is not None:  # AdaKV / KVzip: everything except the masked (batch, head, seq) triples
                    keep = torch.ones(num_kv_heads, T, dtype=torch.bool)
                    keep[masked[1].cpu(), masked[2].cpu()] = False
                    out.append([torch.nonzero(keep[h]).flatten().tolist() for h in range(num_kv_heads)])
                elif li in kept:
                    out.append([sorted(h) for h in kept[li]])
                else:  # nothing pruned in this layer
                    out.append([list(range(T)) for _ in range(num_kv_heads)])
                if masked is not None:
                    layer.self_attn.masked_key_indices = None
            results.append({"case": run["case"], "prompt": run["prompt"], "ratio": run["ratio"],
                            "press": run["press"], "num_tokens": T, "kept": out, "seconds": elapsed,
                            "cache_lengths": [int(cache.layers[i].keys.shape[2]) for i in range(len(layers))]})
    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "kvpress": getattr(kvpress, "__version__", None) or _dist_version("kvpress"),
           "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else platform.processor(),
           "dtype": dtype, "attn_implementation": "sdpa", "stubbed_modules": stubbed, "shims": sorted(shims),
           "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    return {"environment": env, "prompt_logits": prompt_logits, "runs": results}


def _dist_version(name):
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:  # noqa: BLE001 - version is informational
        return None


# --------------------------------------------------------------------------------------------------------------
# Comparison
# --------------------------------------------------------------------------------------------------------------

def compare_sets(a, b):
    """a, b: lists of positions of one stream -> metrics."""
    sa, sb = set(a), set(b)
    inter = len(sa & sb)
    union = len(sa | sb)
    return {"exact": sa == sb, "jaccard": inter / union if union else 1.0,
            "nested": sa <= sb or sb <= sa, "count_a": len(sa), "count_b": len(sb)}


def compare_runs(plan, ours, theirs):
    """Pairs run i of the plan with our run i and the kvpress run of the same (case, prompt, ratio)."""
    key = lambda r: (r["case"], r["prompt"], r["ratio"])  # noqa: E731
    theirs_by = {key(r): r for r in theirs["runs"] if "kept" in r}
    rows = []
    for spec, mine in zip(plan["runs"], ours["runs"]):
        assert mine["method"] == spec["method"] and mine["prompt"] == spec["prompt"], (mine, spec)
        other = theirs_by.get(key(spec))
        if other is None:
            continue
        streams = []
        for layer, (ml, tl) in enumerate(zip(mine["kept"], other["kept"])):
            for head, (m, t) in enumerate(zip(ml, tl)):
                streams.append(dict(compare_sets(m, t), layer=layer, head=head))
        rows.append({"case": spec["case"], "prompt": spec["prompt"], "T": len(plan["prompts"][spec["prompt"]]),
                     "ratio": spec["ratio"], "config": spec["config"], "press": spec["press"],
                     "streams": streams})
    return rows


def summarize(rows):
    """Per case: prompts, streams, exact-match rate, mean/min Jaccard, nesting rate, count agreement."""
    cases = {}
    for row in rows:
        c = cases.setdefault(row["case"], {"case": row["case"], "lengths": set(), "ratios": set(), "streams": []})
        c["lengths"].add(row["T"])
        c["ratios"].add(row["ratio"])
        c["streams"] += row["streams"]
        c.setdefault("config", row["config"])
        c.setdefault("press", row["press"])
    out = []
    for c in cases.values():
        s = c["streams"]
        out.append({"case": c["case"], "lengths": sorted(c["lengths"]), "ratios": sorted(c["ratios"]),
                    "num_streams": len(s), "exact_rate": sum(x["exact"] for x in s) / len(s),
                    "mean_jaccard": sum(x["jaccard"] for x in s) / len(s),
                    "min_jaccard": min(x["jaccard"] for x in s),
                    "nested_rate": sum(x["nested"] for x in s) / len(s),
                    "count_rate": sum(x["count_a"] == x["count_b"] for x in s) / len(s),
                    "config": c["config"], "press": c["press"]})
    return out


def logits_agreement(ours, theirs):
    diffs, top1 = [], []
    for a, b in zip(ours.get("prompt_logits", []), theirs.get("prompt_logits", [])):
        if a is None or b is None:
            continue
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        diffs.append(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)))
        top1.append(int(a.argmax()) == int(b.argmax()))
    return {"max_rel_diff": max(diffs) if diffs else None, "top1_equal": all(top1) if top1 else None,
            "num_prompts": len(diffs)}


def _fmt_press(press):
    p = dict(press)
    name = p.pop("name")
    inner = p.pop("press", None)
    args = ", ".join(f"{k}={v}" for k, v in p.items() if k != "compression_ratio")
    if inner is not None:
        inner_args = ", ".join(f"{k}={v}" for k, v in inner.items() if k not in ("name", "compression_ratio"))
        args = (args + ", " if args else "") + f"press={inner['name']}({inner_args})"
    return f"{name}({args})"


def _fmt_config(case_summary):
    c = dict(case_summary["config"])
    for k in ("budget", "ratio"):
        if k in c:
            c[k] = "matched"
    return ", ".join(f"{k}={v}" for k, v in c.items())


def markdown_table(summary):
    lines = ["| case | our config | kvpress press | ratios r | prompts T | streams | exact match | mean Jaccard "
             "| min Jaccard | nested | same count |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['case']} | {_fmt_config(s)} | {_fmt_press(s['press'])} | "
                     f"{', '.join(str(r) for r in s['ratios'])} | {', '.join(str(t) for t in s['lengths'])} | "
                     f"{s['num_streams']} | {100 * s['exact_rate']:.1f}% | {s['mean_jaccard']:.4f} | "
                     f"{s['min_jaccard']:.4f} | {100 * s['nested_rate']:.1f}% | {100 * s['count_rate']:.1f}% |")
    return "\n".join(lines)


def per_layer_counts(plan, ours, theirs, case):
    """[(T, r, our per-layer mean kept, kvpress per-layer mean kept)] for one case."""
    key = lambda r: (r["case"], r["prompt"], r["ratio"])  # noqa: E731
    theirs_by = {key(r): r for r in theirs["runs"] if "kept" in r}
    out = []
    for spec, mine in zip(plan["runs"], ours["runs"]):
        other = theirs_by.get(key(spec))
        if spec["case"] != case or other is None:
            continue
        out.append((len(plan["prompts"][spec["prompt"]]), spec["ratio"],
                    [[len(h) for h in layer] for layer in mine["kept"]],
                    [[len(h) for h in layer] for layer in other["kept"]]))
    return out


def compare_main(args):
    plan = json.loads(pathlib.Path(args.plan).read_text())
    ours = json.loads(pathlib.Path(args.ours).read_text())
    theirs = json.loads(pathlib.Path(args.kvpress).read_text())
    report = {"environment": theirs.get("environment"), "logits": logits_agreement(ours, theirs),
              "summary": summarize(compare_runs(plan, ours, theirs))}
    parts = ["## ours vs kvpress (" + str((theirs.get("environment") or {}).get("dtype")) + ")",
             markdown_table(report["summary"]), "",
             f"prompt logits (dense forward): {report['logits']}"]
    if args.reference:
        ref = json.loads(pathlib.Path(args.reference).read_text())
        report["reference"] = {
            "environment": ref.get("environment"),
            "ours_vs_reference": summarize(compare_runs(plan, ours, ref)),
            "kvpress_vs_reference": summarize(_as_ours(plan, theirs, ref)),
        }
        parts += ["", "## ours vs kvpress (" + str(ref["environment"]["dtype"]) + ")",
                  markdown_table(report["reference"]["ours_vs_reference"]), "",
                  "## kvpress (" + str(theirs["environment"]["dtype"]) + ") vs kvpress ("
                  + str(ref["environment"]["dtype"]) + "): the rounding noise floor",
                  markdown_table(report["reference"]["kvpress_vs_reference"])]
    counts = {case: per_layer_counts(plan, ours, theirs, case) for case in ("pyramidkv", "pyramidkv-w8", "adakv")}
    report["counts"] = counts
    parts.append("")
    for case, items in counts.items():
        for T, r, mine, other in items:
            parts.append(f"{case} T={T} r={r}: ours {mine} | kvpress {other}")
    text = "\n".join(parts)
    print(text)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(text + "\n")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1, default=list))


def _as_ours(plan, a, b):
    """compare_runs with kvpress run set `a` in the role of ours (same plan order)."""
    key = lambda r: (r["case"], r["prompt"], r["ratio"])  # noqa: E731
    a_by = {key(r): r for r in a["runs"] if "kept" in r}
    ordered = {"runs": [dict(a_by[key(s)], method=s["method"]) if key(s) in a_by else
                        {"method": s["method"], "prompt": s["prompt"], "kept": []} for s in plan["runs"]]}
    return [r for r in compare_runs(plan, ordered, b) if r["streams"]]


# --------------------------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("checkpoint")
    c.add_argument("dir")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--dims", default="{}", help="JSON overrides of the default dimensions")
    p = sub.add_parser("plan")
    p.add_argument("checkpoint")
    p.add_argument("out")
    p.add_argument("--lengths", default="")
    p.add_argument("--ratios", default="")
    k = sub.add_parser("kvpress")
    k.add_argument("checkpoint")
    k.add_argument("plan")
    k.add_argument("out")
    k.add_argument("--device", default="cuda")
    k.add_argument("--dtype", default="float32")
    k.add_argument("--cases", default="")
    m = sub.add_parser("compare")
    m.add_argument("plan")
    m.add_argument("ours")
    m.add_argument("kvpress")
    m.add_argument("--reference", default="")
    m.add_argument("--markdown", default="")
    m.add_argument("--json", default="")
    args = ap.parse_args(argv)
    if args.cmd == "checkpoint":
        make_checkpoint(args.dir, seed=args.seed, **json.loads(args.dims))
    elif args.cmd == "plan":
        lengths = [int(x) for x in args.lengths.split(",") if x]
        ratios = [float(x) for x in args.ratios.split(",") if x]
        plan = make_plan(args.checkpoint, lengths=lengths or None, ratios=ratios or None)
        pathlib.Path(args.out).write_text(json.dumps(plan))
        print(f"{len(plan['runs'])} runs over prompts of {plan['lengths']} tokens; skipped: {plan['skipped']}")
    elif args.cmd == "kvpress":
        plan = json.loads(pathlib.Path(args.plan).read_text())
        cases = [x for x in args.cases.split(",") if x]
        result = run_kvpress(args.checkpoint, plan, device=args.device, dtype=args.dtype, cases=cases or None)
        pathlib.Path(args.out).write_text(json.dumps(result))
        print(json.dumps(result["environment"]))
    elif args.cmd == "compare":
        compare_main(args)


if __name__ == "__main__":
    main()
