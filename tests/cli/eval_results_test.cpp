// ResultsFile: finished cells survive a reopen, a changed configuration is a new cell, bad lines are errors.
#include <gtest/gtest.h>

#include <fstream>

#include "cli/eval_results.h"
#include "../loader/test_models.h"

namespace se::cli {
namespace {

nlohmann::json cell(int sample, double budget = 0.25, const std::string& store = "auto") {
  return {{"model", "m"},          {"method", "snapkv"}, {"budget", budget}, {"kv_cache_dtype", store},
          {"task", "niah_single"}, {"context", 4096},    {"sample", sample}, {"config", {{"depth", 0.5}}}};
}

TEST(EvalResultsTest, ReopenSkipsFinishedCells) {
  const std::string path = testing::scratch_path("eval_results_test.jsonl");
  std::filesystem::remove(path);
  {
    auto file = ResultsFile::open(path);
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    ASSERT_TRUE(file->append(cell(0), {{"correct", true}}).is_ok());
    ASSERT_TRUE(file->append(cell(1), {{"correct", false}}).is_ok());
    EXPECT_FALSE(file->append(cell(1), {{"correct", true}}).is_ok());
  }
  auto file = ResultsFile::open(path);
  ASSERT_TRUE(file.is_ok());
  EXPECT_EQ(file->size(), 2u);
  ASSERT_NE(file->find(cell(0)), nullptr);
  EXPECT_EQ((*file->find(cell(0)))["correct"], true);
  EXPECT_EQ((*file->find(cell(1)))["correct"], false);
  EXPECT_EQ(file->find(cell(2)), nullptr);
  EXPECT_EQ(file->find(cell(0, 0.5)), nullptr);  // another configuration
  ASSERT_TRUE(file->append(cell(2), {{"correct", true}}).is_ok());
  auto again = ResultsFile::open(path);
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->records().size(), 3u);
}

// A file from before cells named their KV store: its cells are the explicit store's, and a store's cell is new.
TEST(EvalResultsTest, CellsWithoutAStoreReadAsTheExplicitStore) {
  const std::string path = testing::scratch_path("eval_results_old.jsonl");
  nlohmann::json old_cell = cell(0);
  old_cell.erase("kv_cache_dtype");
  {
    std::ofstream out(path, std::ios::trunc);
    out << nlohmann::json{{"cell", old_cell}, {"result", {{"correct", true}}}}.dump() << '\n';
  }
  auto file = ResultsFile::open(path);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  ASSERT_NE(file->find(cell(0)), nullptr);
  EXPECT_EQ((*file->find(cell(0)))["correct"], true);
  EXPECT_EQ(file->find(cell(0, 0.25, "kivi2")), nullptr);
  EXPECT_TRUE(file->append(cell(0, 0.25, "kivi2"), {{"correct", false}}).is_ok());
}

TEST(EvalResultsTest, BadLineIsAnError) {
  const std::string path = testing::scratch_path("eval_results_bad.jsonl");
  {
    std::ofstream out(path);
    out << nlohmann::json{{"cell", cell(0)}, {"result", 1}}.dump() << "\n{not json\n";
  }
  auto file = ResultsFile::open(path);
  ASSERT_FALSE(file.is_ok());
  EXPECT_NE(file.status().message().find("line 2"), std::string::npos);
}

TEST(EvalResultsTest, InMemoryWithoutPath) {
  auto file = ResultsFile::open("");
  ASSERT_TRUE(file.is_ok());
  ASSERT_TRUE(file->append(cell(0), 1).is_ok());
  EXPECT_NE(file->find(cell(0)), nullptr);
}

}  // namespace
}  // namespace se::cli
