"""kvzip against the numpy oracle (oracles/kvzip.py) through the real SparseController: the tool feeds each
reconstruction pass the case's q/k/v. Per trial: the repeat inputs (token ids) of every pass, the score tensor
(1e-4 relative), the threshold, the kept set of every (layer, KV head) (100% equal), no pass token left behind,
decode attention equal to dense attention over the kept set, and the memory model (exact while uncompressed, an
upper bound after; the pass peak within transient_extra_tokens)."""
import numpy as np
import pytest

import fidelity_harness as fh
from oracles import kvzip as oracle
from oracles.common import attention_over

ENCODE = {oracle.FIRST_INSTRUCTION: [101, 102, 103, 104, 105, 106, 107],
          oracle.NEXT_INSTRUCTION: list(range(201, 213)),
          "<|im_end|>\n<|im_start|>assistant\n": [301, 302, 303]}


def trial_params(seed):
    rng = np.random.default_rng(1000 + seed)
    num_kv_heads = [2, 8][seed % 2]            # GQA group 4, then group 1 (H = 8)
    prefill_len = int(rng.integers(60, 360))
    num_sink = int(rng.choice([0, 4, 4, 7]))
    chunk_size = int(rng.integers(24, 160))     # 1 to 14 chunks
    num_chunks = int(rng.integers(1, 4))
    cuts = sorted(rng.choice(np.arange(1, prefill_len), size=num_chunks - 1, replace=False).tolist())
    prefill_chunks = [b - a for a, b in zip([0] + cuts, cuts + [prefill_len])]
    config = {"ratio": float(np.round(rng.uniform(0.05, 0.95), 3)), "chunk_size": chunk_size, "n_sink": num_sink,
              "level": "pair-uniform" if seed % 5 == 4 else "pair"}
    tokenizer = seed % 3 != 2  # every third trial runs without a tokenizer (the documented fallback)
    return dict(num_kv_heads=num_kv_heads, prefill_len=prefill_len, prefill_chunks=prefill_chunks,
                page_size=int(rng.choice([4, 16])), head_dim=int(rng.choice([16, 32])), config=config,
                tokenizer=tokenizer)


def run_trial(seed, tmp_path, **overrides):
    params = trial_params(seed)
    params.update(overrides)
    if "token_ids" not in params:  # the prompt's ids (and a few decode ids)
        params["token_ids"] = np.random.default_rng(seed).integers(0, 1000, params["prefill_len"] + 3).tolist()
    config = params["config"]
    encode = ENCODE if params["tokenizer"] else None
    suffix = "<|im_end|>\n<|im_start|>assistant\n"
    prefill_len, num_sink, chunk_size = params["prefill_len"], config["n_sink"], config["chunk_size"]
    inputs = oracle.repeat_inputs(params["token_ids"], prefill_len, num_sink, chunk_size, encode, suffix)
    if config["ratio"] >= 1:
        inputs = []
    completion = len(params["prefill_chunks"]) - 1
    case = fh.Case(num_layers=2, num_heads=8, num_kv_heads=params["num_kv_heads"], head_dim=params["head_dim"],
                   page_size=params["page_size"], prefill_len=prefill_len, prefill_chunks=params["prefill_chunks"],
                   decode_steps=3, seed=seed, passes={completion: [len(x) for x in inputs]} if inputs else {},
                   token_ids=params["token_ids"], encode=encode, chat_suffix=suffix,
                   sliding_windows=params.get("sliding_windows")).generate()
    want = oracle.scores(case, completion, num_sink, chunk_size) if inputs else None
    rated = [l for l, w in enumerate(oracle.windows_of(case)) if not w]
    if inputs and rated:
        config = dict(config, ratio=unambiguous_ratio(want[rated], config))
    result = fh.run("kvzip", config, case, tmp_path)
    return case, config, inputs, completion, want, result


def unambiguous_ratio(score, config, rel_gap=1e-5):
    """`config`'s ratio, or the nearest one whose kept set does not hinge on two scores closer than fp32 can
    order (the engine scores in fp32, the oracle in float64; a boundary pair that close is a tie)."""
    ratio = config["ratio"]
    if ratio <= 0 or ratio >= 1:
        return ratio
    uniform = config["level"] == "pair-uniform"
    rows = np.sort(score.reshape(score.shape[0] * score.shape[1], -1), axis=1)[:, ::-1]
    flat = np.sort(score.reshape(-1))[::-1]
    step = 1 / (rows.shape[1] if uniform else flat.size)

    def ambiguous(r):
        if uniform:
            k = int(rows.shape[1] * r)
            return 0 < k < rows.shape[1] and np.any(rows[:, k - 1] - rows[:, k] < rel_gap * rows[:, k - 1])
        n = max(int(flat.size * r) - 1, 0)
        return n > 0 and flat[n - 1] - flat[n] < rel_gap * flat[n - 1]

    for j in range(200):
        for r in (ratio + j * step, ratio - j * step):
            if 0 < r < 1 and not ambiguous(r):
                return float(r)
    raise AssertionError("no unambiguous ratio")


def check_trial(case, config, inputs, completion, want, result):
    prefill_len, num_sink = case.prefill_len, config["n_sink"]
    steps = case.steps()
    # The passes ran in the step completing the prompt, with the oracle's repeat inputs.
    assert result.passes[completion] == inputs
    assert all(p == [] for s, p in enumerate(result.passes) if s != completion)

    if inputs:
        state = result.states[completion]
        got = np.asarray(state["scores"])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-8)
        assert state["passes"] == [len(x) for x in inputs]
        windows = oracle.windows_of(case)
        context_kept, threshold = oracle.select(want, config["ratio"], config["level"], windows)
        # The engine's selection from its own scores is the oracle's rule exactly (threshold and mask)...
        own_kept, own_threshold = oracle.select(got, config["ratio"], config["level"], windows)
        if threshold is not None:
            assert state["threshold"] == own_threshold
    else:
        context_kept = [[list(range(prefill_len - num_sink))] * case.num_kv_heads] * case.num_layers
        own_kept = context_kept

    total = 0
    for step, n in enumerate(steps):
        total += n
        for layer in range(case.num_layers):
            for h in range(case.num_kv_heads):
                kept = result.kept[step][layer][h]
                if step < completion:
                    assert kept == list(range(total))
                    continue
                sinks = oracle.kept_sinks(prefill_len, num_sink, oracle.windows_of(case)[layer]) if inputs \
                    else list(range(num_sink))
                expected = sinks + [num_sink + j for j in context_kept[layer][h]] + list(range(prefill_len, total))
                # ...and, from the oracle's scores, the same pairs stay: 100% of every (layer, KV head).
                assert kept == expected, f"step {step} layer {layer} head {h}"
                assert [num_sink + j for j in own_kept[layer][h]] == kept[len(sinks):len(kept) - (total - prefill_len)]
        if step > completion:  # decode: one row against the kept set, its own token included
            for layer in range(case.num_layers):
                keys, values = case.all_keys(layer), case.all_values(layer)
                window = oracle.windows_of(case)[layer]  # a window covers the last W stored tokens
                visible = [head[-window:] if window else head for head in result.kept[step][layer]]
                dense = attention_over(case.q[step][layer][0], keys, values, visible, 1 / np.sqrt(case.head_dim))
                np.testing.assert_allclose(result.outputs[step][layer][0], dense, rtol=1e-4, atol=1e-5)

    # Memory: exact while every token is resident, an upper bound once compressed; the passes' peak is the full
    # prompt plus the longest repeat input, within what the method declares.
    for step in range(len(steps)):
        held = sum(-(-len(head) // case.page_size) for layer in result.kept[step] for head in layer)
        assert result.resident_pages[step] == held  # eviction freed the pages it emptied
        if step < completion or not inputs:
            assert result.reported_pages[step] == result.resident_pages[step]
        else:
            assert result.reported_pages[step] >= result.resident_pages[step]
    if inputs:
        streams = case.num_layers * case.num_kv_heads
        longest = max(len(x) for x in inputs)
        assert result.transient_extra_tokens >= longest
        assert result.pass_peak_pages[completion] == streams * -(-(prefill_len + longest) // case.page_size)


@pytest.mark.parametrize("seed", range(110))
def test_kvzip_matches_oracle(seed, tmp_path):
    check_trial(*run_trial(seed, tmp_path))


@pytest.mark.parametrize("ratio", [0.0, 1.0])
def test_kvzip_ratio_edges(ratio, tmp_path):
    """ratio 0 keeps only the sinks (int(N * 0) - 1 clamps to the top score, nothing is strictly above it);
    ratio 1 runs no pass and keeps everything."""
    params = trial_params(0)
    params["config"] = dict(params["config"], ratio=ratio, level="pair")
    check_trial(*run_trial(0, tmp_path, config=params["config"]))


def test_kvzip_short_prompt_is_left_alone(tmp_path):
    """A prompt no longer than the sinks has no context to rate: no pass, nothing evicted."""
    params = trial_params(1)
    check_trial(*run_trial(1, tmp_path, prefill_len=4, prefill_chunks=[4],
                           config=dict(params["config"], n_sink=4), token_ids=[1, 2, 3, 4, 5, 6, 7]))


@pytest.mark.parametrize("seed", range(3))
def test_kvzip_memory_bound_is_the_largest_split(seed, tmp_path):
    """The reported pages after compression are the most any split of the kept pairs over streams can take
    (brute force over small cases)."""
    case, config, inputs, completion, _, result = run_trial(
        seed, tmp_path, prefill_len=70, prefill_chunks=[70], page_size=4,
        config={"ratio": 0.3, "chunk_size": 32, "n_sink": 4, "level": "pair"})
    streams = case.num_layers * case.num_kv_heads
    num_context = case.prefill_len - 4
    total = max(int(streams * num_context * 0.3) - 1, 0)
    for step in range(completion, len(case.steps())):
        decoded = step - completion
        want = oracle.most_pages(streams, 4 + decoded, num_context, total, case.page_size)
        assert result.reported_pages[step] == want


@pytest.mark.parametrize("seed", range(12))
def test_kvzip_sliding_window_layers_keep_their_visible_tail(seed, tmp_path):
    """Gemma-3-style layers with a sliding window are not rated: they keep the newest context tokens their later
    queries can see, and the threshold runs over the full-attention layers alone."""
    windows = [[24, 0], [0, 40], [16, 16]][seed % 3]
    check_trial(*run_trial(seed, tmp_path, sliding_windows=windows))


def test_kvzip_rejects_unknown_keys(tmp_path):
    case = fh.Case(prefill_len=20, seed=0).generate()
    with pytest.raises(Exception):
        fh.run("kvzip", {"compression_ratio": 0.5}, case, tmp_path)
