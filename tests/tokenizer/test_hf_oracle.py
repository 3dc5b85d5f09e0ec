"""Our tokenizers against HF `tokenizers` on the real models' vocabularies (CTest label `model`).

The oracle is transformers' GGUF -> tokenizers conversion of the same GGUF file (see oracle.py).
On a corpus of >= 10,000 varied entries (corpus.py) the ids must be identical, with special
tokens parsed and in plain-text mode; decoding must round-trip and agree with HF; and the
tokenizer.json that `tokenizers` writes for the oracle must load (Tokenizer::from_hf_files) into
a tokenizer giving the same ids as the GGUF one.
"""
import json
import os
import types

import pytest

from corpus import build_corpus
from oracle import (cached_hf_tokenizer, first_mismatches, gemma3_gguf, run_tool, scratch_dir,
                    smollm2_gguf)


@pytest.fixture(scope="module")
def corpus():
    entries, sources = build_corpus()
    assert len(entries) >= 10_000, f"corpus too small: {len(entries)} entries from {len(sources)} files"
    return entries


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model(request, corpus):
    gguf = smollm2_gguf() if request.param == "smollm2" else gemma3_gguf()
    hf, json_path = cached_hf_tokenizer(gguf, request.param)
    gguf_args = ["--gguf", gguf]
    return types.SimpleNamespace(
        name=request.param, gguf_args=gguf_args, hf=hf, json_path=json_path,
        ours=run_tool(gguf_args, "encode", corpus),
        ours_plain=run_tool(gguf_args, "encode", corpus, "--no-parse-special"),
        info=run_tool(gguf_args, "info", []))


def test_ids_match_hf(model, corpus):
    expected = [e.ids for e in model.hf.encode_batch(corpus, add_special_tokens=False)]
    mismatched = sum(e != a for e, a in zip(expected, model.ours))
    assert len(model.ours) == len(corpus)
    assert mismatched == 0, (f"{model.name}: {mismatched}/{len(corpus)} entries differ\n"
                             + first_mismatches(corpus, expected, model.ours))


def test_plain_text_mode_matches_hf(model, corpus):
    model.hf.encode_special_tokens = True
    try:
        expected = [e.ids for e in model.hf.encode_batch(corpus, add_special_tokens=False)]
    finally:
        model.hf.encode_special_tokens = False
    mismatched = sum(e != a for e, a in zip(expected, model.ours_plain))
    assert mismatched == 0, (f"{model.name}: {mismatched}/{len(corpus)} entries differ\n"
                             + first_mismatches(corpus, expected, model.ours_plain))
    special = set(model.info["special_ids"])
    assert not any(i in special for ids in model.ours_plain for i in ids)


def test_decode_round_trips_and_matches_hf(model, corpus):
    decoded_plain = run_tool(model.gguf_args, "decode", model.ours_plain)
    bad = [i for i, (t, d) in enumerate(zip(corpus, decoded_plain)) if t != d]
    assert not bad, f"{model.name}: {len(bad)} entries do not round-trip, first {corpus[bad[0]]!r} -> {decoded_plain[bad[0]]!r}"
    decoded = run_tool(model.gguf_args, "decode", model.ours)
    expected = model.hf.decode_batch(model.ours, skip_special_tokens=False)
    assert decoded == expected
    decoded_skip = run_tool(model.gguf_args, "decode", model.ours, "--skip-special")
    assert decoded_skip == model.hf.decode_batch(model.ours, skip_special_tokens=True)


def test_special_tokens(model):
    info = model.info
    if model.name == "smollm2":
        assert (info["bos_token"], info["eos_token"], info["add_bos"]) == ("<|im_start|>", "<|im_end|>", False)
        assert {0, 2} <= set(info["eog_ids"])
    else:
        assert (info["bos_token"], info["eos_token"], info["add_bos"]) == ("<bos>", "<eos>", True)
        assert {1, 106} <= set(info["eog_ids"])
    assert info["vocab_size"] == model.hf.get_vocab_size(with_added_tokens=True)
    hf_special = sorted(t.id if hasattr(t, "id") else i
                        for i, t in model.hf.get_added_tokens_decoder().items() if t.special)
    assert info["special_ids"] == hf_special


def test_tokenizer_json_matches_gguf(model, corpus):
    config = os.path.join(scratch_dir(), f"{model.name}-oracle.tokenizer_config.json")
    with open(config, "w", encoding="utf-8") as f:
        json.dump({"bos_token": model.info["bos_token"], "eos_token": model.info["eos_token"],
                   "add_bos_token": model.info["add_bos"], "add_eos_token": False}, f)
    json_args = ["--json", model.json_path, "--config", config]
    ours_json = run_tool(json_args, "encode", corpus)
    mismatched = sum(a != b for a, b in zip(model.ours, ours_json))
    assert mismatched == 0, (f"{model.name}: tokenizer.json and GGUF differ on {mismatched} entries\n"
                             + first_mismatches(corpus, model.ours, ours_json))
    info_json = run_tool(json_args, "info", [])
    for key in ("vocab_size", "bos_id", "eos_id", "add_bos", "eog_ids", "special_ids"):
        assert info_json[key] == model.info[key], key
