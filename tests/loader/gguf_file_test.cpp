#include "loader/gguf_file.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "gguf_builder.h"
#include "test_models.h"

namespace se {
namespace {

using testing::GgufBuilder;

Result<GgufFile> parse_bytes(const std::vector<uint8_t>& bytes) {
  auto owned = std::make_shared<std::vector<uint8_t>>(bytes);
  return GgufFile::parse(owned, {owned->data(), owned->size()}, "test.gguf");
}

TEST(GgufFileTest, ReadsEveryScalarType) {
  GgufBuilder b;
  b.add_scalar("u8", GgufValueType::kU8, uint8_t{200})
      .add_scalar("i8", GgufValueType::kI8, int8_t{-5})
      .add_scalar("u16", GgufValueType::kU16, uint16_t{60000})
      .add_scalar("i16", GgufValueType::kI16, int16_t{-30000})
      .add_u32("u32", 4000000000u)
      .add_i32("i32", -7)
      .add_f32("f32", 1.5f)
      .add_bool("bool", true)
      .add_string("str", "héllo")
      .add_scalar("u64", GgufValueType::kU64, uint64_t{1} << 40)
      .add_scalar("i64", GgufValueType::kI64, int64_t{-(int64_t{1} << 40)})
      .add_scalar("f64", GgufValueType::kF64, 0.25);
  auto file = parse_bytes(b.build());
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  EXPECT_EQ(file->version(), 3u);
  EXPECT_EQ(file->metadata().size(), 12u);
  EXPECT_EQ(file->metadata()[0].first, "u8");
  EXPECT_EQ(file->find_u32("u8"), 200u);
  EXPECT_EQ(file->find_i64("i8"), -5);
  EXPECT_EQ(file->find_u32("i8"), std::nullopt);  // negative does not convert to unsigned
  EXPECT_EQ(file->find_u32("u16"), 60000u);
  EXPECT_EQ(file->find_i64("i16"), -30000);
  EXPECT_EQ(file->find_u32("u32"), 4000000000u);
  EXPECT_EQ(file->find_i64("i32"), -7);
  EXPECT_EQ(file->find_f32("f32"), 1.5f);
  EXPECT_EQ(file->find_f32("i32"), -7.0f);  // integers widen to float
  EXPECT_EQ(file->find_bool("bool"), true);
  EXPECT_EQ(file->find_bool("u8"), std::nullopt);
  EXPECT_EQ(file->find_string("str"), "héllo");
  EXPECT_EQ(file->find_string("u8"), std::nullopt);
  EXPECT_EQ(file->find_u32("u64"), std::nullopt);  // does not fit
  EXPECT_EQ(file->find_i64("u64"), int64_t{1} << 40);
  EXPECT_EQ(file->find_i64("i64"), -(int64_t{1} << 40));
  EXPECT_EQ(file->find_f32("f64"), 0.25f);
  EXPECT_EQ(file->find_u32("missing"), std::nullopt);
  EXPECT_EQ(file->find("i64")->type(), GgufValueType::kI64);
  EXPECT_EQ(file->find("bool")->describe(), "true");

  auto missing = file->get_u32("missing");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("test.gguf"), std::string::npos);
  auto wrong = file->get_string("u32");
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("'u32'"), std::string::npos);
  EXPECT_EQ(*file->get_f32("f32"), 1.5f);
}

TEST(GgufFileTest, ReadsArrays) {
  GgufBuilder b;
  b.add_string_array("tokens", {"a", "", "<s>", "long token"})
      .add_array<float>("scores", GgufValueType::kF32, {0.5f, -1.0f, 3.0f})
      .add_array<double>("scores64", GgufValueType::kF64, {0.5, 2.0})
      .add_array<int32_t>("types", GgufValueType::kI32, {1, 2, 3, -4})
      .add_array<uint8_t>("bytes", GgufValueType::kU8, {7, 8})
      .add_array<uint64_t>("big", GgufValueType::kU64, {uint64_t{1} << 40})
      .add_array<int32_t>("empty", GgufValueType::kI32, {});
  // An array of two arrays of u16.
  std::vector<uint8_t> nested = GgufBuilder::array_header(GgufValueType::kArray, 2);
  for (uint16_t v : {uint16_t{1}, uint16_t{2}}) {
    std::vector<uint8_t> inner = GgufBuilder::array_header(GgufValueType::kU16, 1);
    GgufBuilder::append_pod(inner, &v, 2);
    nested.insert(nested.end(), inner.begin(), inner.end());
  }
  b.add_raw("nested", GgufValueType::kArray, nested);
  b.add_string("after", "ok");

  auto file = parse_bytes(b.build());
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  EXPECT_EQ(file->find_string_array("tokens"),
            (std::vector<std::string>{"a", "", "<s>", "long token"}));
  EXPECT_EQ(file->find_f32_array("scores"), (std::vector<float>{0.5f, -1.0f, 3.0f}));
  EXPECT_EQ(file->find_f32_array("scores64"), (std::vector<float>{0.5f, 2.0f}));
  EXPECT_EQ(file->find_i32_array("types"), (std::vector<int32_t>{1, 2, 3, -4}));
  EXPECT_EQ(file->find_i32_array("bytes"), (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(file->find_i32_array("big"), std::nullopt);
  EXPECT_EQ(file->find("big")->to_i64_array(), (std::vector<int64_t>{int64_t{1} << 40}));
  EXPECT_EQ(file->find_i32_array("empty"), std::vector<int32_t>{});
  EXPECT_EQ(file->find_i32_array("tokens"), std::nullopt);
  EXPECT_EQ(file->find_string_array("types"), std::nullopt);
  const GgufValue* tokens = file->find("tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_TRUE(tokens->is_array());
  EXPECT_EQ(tokens->elem_type(), GgufValueType::kString);
  EXPECT_EQ(tokens->count(), 4u);
  EXPECT_EQ(tokens->describe(), "[STRING x 4]");
  const GgufValue* n = file->find("nested");
  EXPECT_EQ(n->elem_type(), GgufValueType::kArray);
  EXPECT_EQ(n->count(), 2u);
  EXPECT_EQ(file->find_string("after"),
            "ok");  // the walk over the nested array ended at the right byte
}

TEST(GgufFileTest, LocatesTensorsWithAlignment) {
  for (uint32_t alignment : {32u, 64u}) {
    GgufBuilder b;
    if (alignment != 32) b.add_u32("general.alignment", alignment);
    b.add_string("general.architecture", "llama");
    b.add_f32_tensor("a", {3, 2}, {1, 2, 3, 4, 5, 6});
    std::vector<uint8_t> q8(34 * 2, 0);
    q8[0] = 0x3c;
    b.add_tensor("b.q8", GgmlType::kQ8_0, {64}, q8);
    b.add_f32_tensor("c", {1}, {9});
    auto file = parse_bytes(b.build(alignment));
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    EXPECT_EQ(file->alignment(), alignment);
    EXPECT_EQ(file->data_offset() % alignment, 0u);
    EXPECT_EQ(file->architecture(), "llama");
    ASSERT_EQ(file->tensors().size(), 3u);
    const GgufTensorInfo* a = file->find_tensor("a");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->dims, (std::vector<int64_t>{3, 2}));
    EXPECT_EQ(a->numel(), 6);
    EXPECT_EQ(a->nbytes, 24u);
    EXPECT_EQ(a->offset, 0u);
    float v[6];
    std::memcpy(v, a->data, 24);
    EXPECT_EQ(v[5], 6.0f);
    const GgufTensorInfo* q = file->find_tensor("b.q8");
    EXPECT_EQ(q->type, GgmlType::kQ8_0);
    EXPECT_EQ(q->nbytes, 68u);
    EXPECT_EQ(q->offset, alignment);
    EXPECT_EQ(q->data[0], 0x3c);
    EXPECT_EQ(file->find_tensor("c")->offset % alignment, 0u);
    EXPECT_EQ(file->find_tensor("nope"), nullptr);
  }
}

std::vector<uint8_t> small_file() {
  GgufBuilder b;
  b.add_string("general.architecture", "llama").add_string_array("tokens", {"x", "yy"});
  b.add_array<int32_t>("types", GgufValueType::kI32, {1, 2});
  b.add_f32_tensor("w", {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  b.add_f32_tensor("v", {4}, {1, 2, 3, 4});
  return b.build();
}

TEST(GgufFileTest, EveryTruncationFailsCleanly) {
  std::vector<uint8_t> full = small_file();
  ASSERT_TRUE(parse_bytes(full).is_ok());
  // Cutting anywhere before the last tensor's end must fail with a message naming the file.
  const size_t last_end = full.size() - 32 + 16;
  for (size_t n = 0; n < last_end; ++n) {
    std::vector<uint8_t> cut(full.begin(), full.begin() + n);
    auto r = parse_bytes(cut);
    ASSERT_FALSE(r.is_ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_NE(r.status().message().find("test.gguf"), std::string::npos) << r.status().to_string();
  }
}

// Patches a little-endian u64 at `pos`.
void put_u64(std::vector<uint8_t>& b, size_t pos, uint64_t v) {
  std::memcpy(b.data() + pos, &v, 8);
}

TEST(GgufFileTest, RejectsCorruptHeaders) {
  std::vector<uint8_t> good = small_file();

  std::vector<uint8_t> bad_magic = good;
  bad_magic[0] = 'X';
  EXPECT_EQ(parse_bytes(bad_magic).status().code(), StatusCode::kInvalidArgument);

  std::vector<uint8_t> v1 = good;
  v1[4] = 1;
  EXPECT_EQ(parse_bytes(v1).status().code(), StatusCode::kUnimplemented);

  std::vector<uint8_t> big_endian = good;
  big_endian[4] = 0;
  big_endian[7] = 3;
  EXPECT_NE(parse_bytes(big_endian).status().message().find("big-endian"), std::string::npos);

  // Huge tensor / metadata counts fail before any allocation.
  std::vector<uint8_t> many_tensors = good;
  put_u64(many_tensors, 8, uint64_t{1} << 60);
  EXPECT_EQ(parse_bytes(many_tensors).status().code(), StatusCode::kDataLoss);
  std::vector<uint8_t> many_kv = good;
  put_u64(many_kv, 16, ~uint64_t{0});
  EXPECT_EQ(parse_bytes(many_kv).status().code(), StatusCode::kDataLoss);

  // The first key's string length.
  std::vector<uint8_t> long_key = good;
  put_u64(long_key, 24, uint64_t{1} << 62);
  EXPECT_EQ(parse_bytes(long_key).status().code(), StatusCode::kDataLoss);
}

TEST(GgufFileTest, RejectsBadValuesAndTensors) {
  {
    GgufBuilder b;
    b.add_raw("k", static_cast<GgufValueType>(13), {0, 0, 0, 0});
    auto r = parse_bytes(b.build());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(r.status().message().find("'k'"), std::string::npos) << r.status().to_string();
  }
  {
    GgufBuilder b;
    std::vector<uint8_t> arr = GgufBuilder::array_header(GgufValueType::kString, uint64_t{1} << 61);
    b.add_raw("arr", GgufValueType::kArray, arr);
    auto r = parse_bytes(b.build());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(r.status().message().find("arr"), std::string::npos);
  }
  {
    GgufBuilder b;
    b.add_string("k", "v").add_string("k", "w");
    EXPECT_NE(parse_bytes(b.build()).status().message().find("duplicate metadata key"),
              std::string::npos);
  }
  {
    GgufBuilder b;
    b.add_u32("general.alignment", 48);
    EXPECT_NE(parse_bytes(b.build()).status().message().find("power of two"), std::string::npos);
  }
  {
    GgufBuilder b;
    b.add_tensor("t", static_cast<GgmlType>(77), {4}, std::vector<uint8_t>(16));
    auto r = parse_bytes(b.build());
    EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(r.status().message().find("'t'"), std::string::npos);
  }
  {
    GgufBuilder b;
    b.add_tensor("q", GgmlType::kQ4_0, {16},
                 std::vector<uint8_t>(18));  // 16 is not a multiple of 32
    EXPECT_NE(parse_bytes(b.build()).status().message().find("block size"), std::string::npos);
  }
  {
    GgufBuilder b;
    b.add_f32_tensor("x", {4}, {1, 2, 3, 4}).add_f32_tensor("x", {4}, {1, 2, 3, 4});
    EXPECT_NE(parse_bytes(b.build()).status().message().find("duplicate tensor"),
              std::string::npos);
  }
  {
    GgufBuilder b;
    b.add_f32_tensor("x", {5, 1, 1, 1, 1}, {1, 2, 3, 4, 5});
    EXPECT_NE(parse_bytes(b.build()).status().message().find("dims"), std::string::npos);
  }
  {
    GgufBuilder b;
    b.add_f32_tensor("x", {int64_t{1} << 40, int64_t{1} << 40}, {});
    EXPECT_EQ(parse_bytes(b.build()).status().code(), StatusCode::kDataLoss);
  }
}

// Finds the offset field of the tensor info named `name` (the 8 bytes after its type).
size_t tensor_offset_field(const std::vector<uint8_t>& bytes, const std::string& name,
                           size_t num_dims) {
  std::string needle(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  const size_t at = needle.find(name + std::string(1, static_cast<char>(num_dims)));
  return at + name.size() + 4 + 8 * num_dims + 4;
}

TEST(GgufFileTest, RejectsMisplacedTensors) {
  std::vector<uint8_t> good = small_file();
  const size_t w_off = tensor_offset_field(good, "w", 2);
  const size_t v_off = tensor_offset_field(good, "v", 1);
  {
    std::vector<uint8_t> b = good;
    put_u64(b, w_off, 4);
    EXPECT_NE(parse_bytes(b).status().message().find("alignment"), std::string::npos);
  }
  {
    std::vector<uint8_t> b = good;
    put_u64(b, v_off, 0);  // on top of w
    EXPECT_NE(parse_bytes(b).status().message().find("overlap"), std::string::npos);
  }
  {
    std::vector<uint8_t> b = good;
    put_u64(b, v_off, uint64_t{1} << 63);
    auto r = parse_bytes(b);
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(r.status().message().find("'v'"), std::string::npos);
  }
}

TEST(GgufFileTest, OpenNamesMissingFile) {
  auto r = GgufFile::open("/nonexistent/model.gguf");
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/model.gguf"), std::string::npos);
}

TEST(GgufFileTest, OpensWrittenFileAndOutlivesCopies) {
  const std::string path = testing::scratch_path("gguf_file_test.gguf");
  GgufBuilder b;
  b.add_string("general.name", "tiny").add_f32_tensor("w", {2}, {3, 4});
  b.write(path);
  std::optional<GgufFile> copy;
  {
    auto file = GgufFile::open(path);
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    EXPECT_EQ(file->path(), path);
    copy = *file;
  }
  // The mapping is shared: the copy's views stay valid after the original is gone.
  EXPECT_EQ(copy->find_string("general.name"), "tiny");
  float w[2];
  std::memcpy(w, copy->find_tensor("w")->data, 8);
  EXPECT_EQ(w[1], 4.0f);
}

}  // namespace
}  // namespace se
