#include "base/mapped_file.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace se {
namespace {

TEST(MappedFileTest, MapsBytesAndNamesMissingFiles) {
  auto path = (std::filesystem::temp_directory_path() / "se_mapped_file_test.bin").string();
  {
    std::ofstream out(path, std::ios::binary);
    out << "hello";
  }
  auto file = MappedFile::open(path);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  ASSERT_EQ(file->size(), 5u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(file->data()), 5), "hello");
  std::remove(path.c_str());

  auto missing = MappedFile::open("/nonexistent/x.gguf");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/x.gguf"), std::string::npos);
}

}  // namespace
}  // namespace se
