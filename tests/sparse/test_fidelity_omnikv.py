"""omnikv: at every decode step, filter layers pick exactly the oracle's prompt tokens (oracles/omnikv.py: top-N by
raw q.k/sqrt(d) maxed over all query heads), the sparse layers after them read those tokens plus the decode tail on
every KV head, every other layer (and prefill) reads everything, attention equals dense attention over the selected
tokens, layer roles follow METHODS.md, and nothing is evicted."""
import numpy as np
import pytest

import fidelity_harness as fh
from oracles import omnikv
from oracles.common import attention_over

NUM_TRIALS = 100


def trial(seed):
    """Randomized shapes, filter layers (sometimes one past the model's last layer) and budgets of one trial."""
    rng = np.random.default_rng(9000 + seed)
    group = (1, 4)[seed % 2]
    num_kv_heads = 4 if group == 1 else 2
    num_layers = int(rng.integers(4, 7))
    filters = sorted(int(f) for f in rng.choice(num_layers, size=int(rng.integers(1, 4)), replace=False))
    if seed % 3 == 0:
        filters.append(18)  # not in this model: ignored
    prefill_len = int(rng.integers(60, 400))
    chunks = []
    if rng.random() < 0.5:
        cut = sorted(rng.choice(np.arange(1, prefill_len), size=int(rng.integers(1, 3)), replace=False))
        chunks = [int(b - a) for a, b in zip([0] + cut, cut + [prefill_len])]
    config = {"filter_layers": filters, "num_wait": int(rng.integers(0, 3))}
    if seed % 10 == 9:
        config["num_selected_tokens"] = 4096  # the whole prompt: dense
    elif rng.random() < 0.3:
        config["selected_fraction"] = float(rng.choice([0.05, 0.1, 0.3]))
    else:
        config["num_selected_tokens"] = int(rng.choice([0, 8, 32, 50, 100]))
    case = fh.Case(num_layers=num_layers, num_heads=num_kv_heads * group, num_kv_heads=num_kv_heads,
                   head_dim=int(rng.choice([32, 64])), prefill_len=prefill_len, prefill_chunks=chunks,
                   decode_steps=int(rng.integers(2, 5)), seed=seed)
    return case.generate(), config


def check(case, config, result):
    """Compares every step's selections and decode outputs with the oracle; returns how many sparse layers ran."""
    roles, sources = omnikv.layer_roles(case.num_layers, config["filter_layers"], config.get("num_wait", 1))
    n_kept = omnikv.num_kept(case.prefill_len, config.get("num_selected_tokens", 2048),
                             config.get("selected_fraction"))
    scale = 1 / np.sqrt(case.head_dim)
    total, num_sparse = 0, 0
    for step, n in enumerate(case.steps()):
        total += n
        for layer in range(case.num_layers):
            assert result.kept[step][layer] == [list(range(total))] * case.num_kv_heads  # full history
            want = None
            if n == 1 and roles[layer] == "sparse" and n_kept < case.prefill_len:
                source = sources[layer]
                index = omnikv.select_prompt_tokens(case.q[step][source][0], case.all_keys(source)[:total],
                                                    case.prefill_len, n_kept)
                want = [omnikv.sparse_tokens(index, case.prefill_len, total)] * case.num_kv_heads
                num_sparse += 1
            assert result.selected[step][layer] == want, (step, layer, roles[layer])
            if n == 1:
                keys, values = case.all_keys(layer)[:total], case.all_values(layer)[:total]
                tokens = [range(total)] * case.num_kv_heads if want is None else want
                expect = attention_over(case.q[step][layer][0], keys, values, tokens, scale)
                np.testing.assert_allclose(result.outputs[step][layer][0], expect, rtol=1e-4, atol=1e-5)
    assert result.resident_pages == result.reported_pages
    return num_sparse


@pytest.mark.parametrize("seed", range(NUM_TRIALS))
def test_omnikv_selects_the_oracle_tokens(seed, tmp_path):
    case, config = trial(seed)
    result = fh.run("omnikv", config, case, tmp_path)
    assert result.selection_unit == "token"
    num_sparse = check(case, config, result)
    roles, _ = omnikv.layer_roles(case.num_layers, config["filter_layers"], config["num_wait"])
    if "sparse" in roles and omnikv.num_kept(case.prefill_len, config.get("num_selected_tokens"),
                                             config.get("selected_fraction")) < case.prefill_len:
        assert num_sparse > 0


def test_omnikv_layer_roles_follow_methods_md(tmp_path):
    """METHODS.md's example: F = {2, 8, 18}, num_wait = 1, L = 32 -> dense {0-3, 8, 9, 18, 19}, sparse 4-7 from 2,
    10-17 from 8, 20-31 from 18 (the defaults of filter_layers and num_wait)."""
    roles, sources = omnikv.layer_roles(32, [2, 8, 18], 1)
    assert [l for l in range(32) if roles[l] != "sparse"] == [0, 1, 2, 3, 8, 9, 18, 19]
    assert [l for l in range(32) if roles[l] == "filter"] == [2, 8, 18]
    assert sources[4:8] == [2] * 4 and sources[10:18] == [8] * 8 and sources[20:32] == [18] * 12
    case = fh.Case(num_layers=32, num_heads=4, num_kv_heads=2, head_dim=16, prefill_len=80, decode_steps=2,
                   seed=3).generate()
    config = {"num_selected_tokens": 12}
    result = fh.run("omnikv", config, case, tmp_path)
    config.update(filter_layers=[2, 8, 18], num_wait=1)
    assert check(case, config, result) == 2 * 24
    for step in (1, 2):
        assert [l for l in range(32) if result.selected[step][l] is not None] == \
            [l for l in range(32) if roles[l] == "sparse"]


@pytest.mark.parametrize("num_selected", [1, 2])
def test_omnikv_keeps_a_one_or_two_token_index(num_selected, tmp_path):
    """The smallest indices: the method's index buffers start empty whatever their size."""
    case = fh.Case(num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16, prefill_len=40, decode_steps=3,
                   seed=11).generate()
    config = {"filter_layers": [1], "num_wait": 0, "num_selected_tokens": num_selected}
    result = fh.run("omnikv", config, case, tmp_path)
    assert check(case, config, result) == 3


def test_omnikv_without_filter_layers_in_the_model_is_dense(tmp_path):
    case = fh.Case(num_layers=4, prefill_len=50, decode_steps=2, seed=5).generate()
    config = {"filter_layers": [4, 9], "num_selected_tokens": 8}
    result = fh.run("omnikv", config, case, tmp_path)
    assert all(sel is None for step in result.selected for sel in step)
    assert check(case, config, result) == 0
