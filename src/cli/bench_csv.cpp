#include "cli/bench_csv.h"

#include <filesystem>
#include <fstream>

namespace se::cli {

std::string csv_field(std::string_view text) {
  if (text.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(text);
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string_view("\"\"") : std::string_view(&c, 1);
  return out + "\"";
}

void append_csv(const std::string& path, const std::string& header, const std::string& row) {
  const bool fresh = !std::filesystem::exists(path) || std::filesystem::file_size(path) == 0;
  std::ofstream out(path, std::ios::app);
  if (fresh) out << header << "\n";
  out << row << "\n";
}

}  // namespace se::cli
