#include "loader/safetensors_file.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "safetensors_builder.h"
#include "test_models.h"

namespace se {
namespace {

using testing::ramp;
using testing::safetensors_bytes;

Result<SafetensorsFile> parse_bytes(const std::vector<uint8_t>& bytes) {
  auto owned = std::make_shared<std::vector<uint8_t>>(bytes);
  return SafetensorsFile::parse(owned, {owned->data(), owned->size()}, "x.safetensors");
}

// A file whose header is `header` verbatim followed by `data_bytes` zero bytes.
std::vector<uint8_t> raw_file(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8);
  const uint64_t len = header.size();
  std::memcpy(out.data(), &len, 8);
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data_bytes, 0);
  return out;
}

TEST(SafetensorsFileTest, ReadsTensorsAndMetadata) {
  Tensor h = Tensor::empty(DType::kF16, Shape{2});
  h.data<uint16_t>()[0] = f32_to_f16(1.5f);
  h.data<uint16_t>()[1] = f32_to_f16(-2.0f);
  auto file = parse_bytes(safetensors_bytes({{"a", ramp(Shape{2, 3})}, {"b.h", h}}));
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  ASSERT_EQ(file->tensors().size(), 2u);
  EXPECT_EQ(file->metadata().at("format"), "pt");
  const SafetensorsTensorInfo* a = file->find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, "F32");
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  auto t = file->load("a");
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(t->shape(), (Shape{2, 3}));
  EXPECT_EQ(t->data<float>()[5], 5.0f);
  auto th = file->load("b.h");
  EXPECT_EQ(th->dtype(), DType::kF16);
  EXPECT_EQ(f16_to_f32(th->data<uint16_t>()[1]), -2.0f);
  EXPECT_EQ(file->load("zz").status().code(), StatusCode::kNotFound);
}

TEST(SafetensorsFileTest, EveryTruncationFailsCleanly) {
  std::vector<uint8_t> full = safetensors_bytes({{"a", ramp(Shape{4})}, {"b", ramp(Shape{3})}});
  ASSERT_TRUE(parse_bytes(full).is_ok());
  for (size_t n = 0; n < full.size(); ++n) {
    auto r = parse_bytes(std::vector<uint8_t>(full.begin(), full.begin() + n));
    ASSERT_FALSE(r.is_ok()) << n;
    EXPECT_NE(r.status().message().find("x.safetensors"), std::string::npos)
        << r.status().to_string();
  }
}

TEST(SafetensorsFileTest, RejectsInconsistentHeaders) {
  struct Case {
    std::string header;
    size_t data;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"not json", 0, "valid JSON"},
      {"[1]", 0, "object"},
      {R"({"a": 3})", 0, "'a'"},
      {R"({"a": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}})", 4, "unknown dtype"},
      {R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4, "non-negative"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 4, "needs 8 bytes"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}})", 4, "outside"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", 4, "outside"},
      {R"({"a": {"dtype": "F32", "shape": [1]}})", 4, "data_offsets"},
      {R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})", 4,
       "overflow"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
       8, "overlap"},
      {R"({"__metadata__": {"k": 1}})", 0, "__metadata__"},
  };
  for (const Case& c : cases) {
    auto r = parse_bytes(raw_file(c.header, c.data));
    ASSERT_FALSE(r.is_ok()) << c.header;
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos)
        << c.header << " -> " << r.status().to_string();
  }
  // A header length far beyond the file.
  std::vector<uint8_t> huge(16, 0);
  const uint64_t len = uint64_t{1} << 62;
  std::memcpy(huge.data(), &len, 8);
  EXPECT_EQ(parse_bytes(huge).status().code(), StatusCode::kDataLoss);
}

TEST(SafetensorsFileTest, ShardedCheckpoint) {
  namespace fs = std::filesystem;
  const std::string dir = testing::scratch_path("sharded_ckpt");
  fs::remove_all(dir);
  fs::create_directories(dir);
  testing::write_bytes(dir + "/model-00001-of-00002.safetensors",
                       safetensors_bytes({{"a", ramp(Shape{2})}}));
  testing::write_bytes(dir + "/model-00002-of-00002.safetensors",
                       safetensors_bytes({{"b", ramp(Shape{3}, 7)}}));
  nlohmann::json index = {
      {"metadata", {{"total_size", 20}}},
      {"weight_map",
       {{"a", "model-00001-of-00002.safetensors"}, {"b", "model-00002-of-00002.safetensors"}}}};
  testing::write_text(dir + "/model.safetensors.index.json", index.dump());
  auto ckpt = SafetensorsCheckpoint::open_dir(dir);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  EXPECT_EQ(ckpt->names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(ckpt->load("b")->data<float>()[0], 7.0f);
  EXPECT_EQ(ckpt->files().size(), 2u);

  // The index must match the shards, and may name only files beside it.
  index["weight_map"]["a"] = "model-00002-of-00002.safetensors";
  testing::write_text(dir + "/model.safetensors.index.json", index.dump());
  EXPECT_NE(SafetensorsCheckpoint::open_dir(dir).status().message().find("does not hold"),
            std::string::npos);
  index["weight_map"]["a"] = "../../etc/passwd";
  testing::write_text(dir + "/model.safetensors.index.json", index.dump());
  EXPECT_NE(SafetensorsCheckpoint::open_dir(dir).status().message().find("plain file name"),
            std::string::npos);
  testing::write_text(dir + "/model.safetensors.index.json", "{");
  EXPECT_EQ(SafetensorsCheckpoint::open_dir(dir).status().code(), StatusCode::kInvalidArgument);

  // Without an index, every *.safetensors file counts; duplicates are an error.
  fs::remove(dir + "/model.safetensors.index.json");
  EXPECT_TRUE(SafetensorsCheckpoint::open_dir(dir).is_ok());
  testing::write_bytes(dir + "/extra.safetensors", safetensors_bytes({{"a", ramp(Shape{2})}}));
  EXPECT_NE(SafetensorsCheckpoint::open_dir(dir).status().message().find("also appears"),
            std::string::npos);
  fs::remove_all(dir);
  EXPECT_EQ(SafetensorsCheckpoint::open_dir(dir).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace se
