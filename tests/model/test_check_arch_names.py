"""scripts/check_arch_names.py: passes on this tree, and catches an architecture named in code outside
src/model/arch/."""
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("check_arch_names", ROOT / "scripts" / "check_arch_names.py")
checker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(checker)


def fake_tree(tmp_path, files):
    arch = tmp_path / "src/model/arch/gemma3.cpp"
    arch.parent.mkdir(parents=True)
    arch.write_text('constexpr std::array<std::string_view, 2> kModelTypes = {"gemma3_text", "gemma3"};\n'
                    'const ArchSpec kGemma3Arch{.name = "gemma3", .gguf_architecture = "gemma3"};\n')
    (tmp_path / "src/model/arch/llama.cpp").write_text('const ArchSpec kLlamaArch{.name = "llama"};\n')
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    return checker.violations(tmp_path)


def test_this_tree_names_architectures_only_in_their_files():
    assert checker.violations(ROOT) == []


def test_names_come_from_the_registry_entries(tmp_path):
    fake_tree(tmp_path, {})
    assert checker.arch_names(tmp_path) == ["gemma3", "gemma3_text", "llama"]


def test_a_name_in_code_outside_the_architectures_fails(tmp_path):
    found = fake_tree(tmp_path, {
        "src/loader/gguf_model.cpp": 'if (arch == "gemma3") c["sliding_window"] = 512;\n',
        "src/model/weights.cpp": "const bool llama = config.arch == \"LLAMA\";  // unpermute\n",
    })
    assert len(found) == 3
    assert found[0].startswith("src/loader/gguf_model.cpp:1: names architecture 'gemma3'")
    assert found[1].startswith("src/model/weights.cpp:1: names architecture 'llama'")


def test_comments_the_arch_dir_tokenizer_and_llama_cpp_pass(tmp_path):
    found = fake_tree(tmp_path, {
        "src/model/arch/llama.h": 'void llama_block();  // "gemma3" too\n',
        "src/backend/ops.h": "// per-head norm (Gemma3, Llama)\n/* llama\n gemma3 */\nint x;\n",
        "src/tokenizer/gguf_vocab.cpp": 'if (model == "llama") return spm();\n',
        "src/cli/bench.cpp": 'flag("--no-llama-cpp");  printf("llama.cpp");\n',
    })
    assert found == []
