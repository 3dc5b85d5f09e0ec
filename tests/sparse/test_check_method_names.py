"""scripts/check_method_names.py: passes on this tree, and catches a method named outside its own files."""
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("check_method_names", ROOT / "scripts" / "check_method_names.py")
checker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(checker)


def fake_tree(tmp_path, files):
    registry = tmp_path / "src/sparse/method_registry.cpp"
    registry.parent.mkdir(parents=True)
    registry.write_text('{{"vanilla", "dense"}, &V::create},\n{{"snapkv", "window"}, &S::create},\n'
                        '{{"h2o", "heavy hitters"}, &H::create},\n')
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    return checker.violations(tmp_path)


def test_this_tree_names_methods_only_in_their_files():
    assert checker.violations(ROOT) == []


def test_names_come_from_the_registry_without_the_baseline(tmp_path):
    fake_tree(tmp_path, {})
    assert checker.method_names(tmp_path) == ["h2o", "snapkv"]


def test_a_name_outside_its_files_fails(tmp_path):
    found = fake_tree(tmp_path, {
        "src/engine/runner.cpp": "// evicts the way SnapKV's window does\n",
        "src/backend/ops.h": "int x;  // as H2O needs\n",
    })
    assert len(found) == 2
    assert found[0].startswith("src/backend/ops.h:1: names method 'h2o'")
    assert found[1].startswith("src/engine/runner.cpp:1: names method 'snapkv'")


def test_own_files_registries_and_identifiers_pass(tmp_path):
    found = fake_tree(tmp_path, {
        "src/sparse/methods/snapkv.cpp": "// SnapKV, as H2O does it\n",
        "src/sparse/prune/snapkv_global_scorer.h": "// SnapKV's scores\n",
        "src/sparse/prune/prune_scorer_registry.cpp": "// snapkv, h2o\n",
        "src/engine/prune.cpp": "auto p = PrunePolicy::kSnapKvGlobal;  // \"snapkv_global\"\n",
    })
    assert found == []


def test_a_method_owned_file_may_not_name_another_method(tmp_path):
    found = fake_tree(tmp_path, {"src/sparse/prune/snapkv_global_scorer.cpp": "// unlike h2o\n"})
    assert len(found) == 1 and "names method 'h2o'" in found[0]
