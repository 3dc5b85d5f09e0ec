// The benchmarks' CSV rows: fields quoted as RFC 4180 says (only where a comma, a double quote or a line break
// needs it, inner quotes doubled), and a file that gets its header once however many runs append to it.
#include "cli/bench_csv.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace se::cli {
namespace {

TEST(BenchCsvTest, FieldsAreQuotedOnlyWhereRfc4180NeedsIt) {
  EXPECT_EQ(csv_field("kara"), "kara");
  EXPECT_EQ(csv_field(""), "");
  EXPECT_EQ(csv_field("SmolLM2-135M-Instruct.Q4_1"), "SmolLM2-135M-Instruct.Q4_1");
  EXPECT_EQ(csv_field("my,model"), "\"my,model\"");
  EXPECT_EQ(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(csv_field("two\nlines"), "\"two\nlines\"");
  EXPECT_EQ(csv_field("cr\rhere"), "\"cr\rhere\"");
  EXPECT_EQ(csv_field(R"({"budget":16,"window":32})"), R"("{""budget"":16,""window"":32}")");
}

TEST(BenchCsvTest, TheHeaderIsWrittenOnceAndRowsAppend) {
  const std::filesystem::path path = std::filesystem::path(testing::TempDir()) / "bench_csv_test.csv";
  std::filesystem::remove(path);
  append_csv(path.string(), "model,method", csv_field("a,b") + "," + csv_field("kara"));
  append_csv(path.string(), "model,method", csv_field("c") + "," + csv_field("x\"y"));
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "model,method\n\"a,b\",kara\nc,\"x\"\"y\"\n");
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace se::cli
