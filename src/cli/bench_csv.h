// The CSV rows the engine benchmarks append (`bench decode --csv`, `bench throughput --csv`): one file collects the
// rows of many runs, which the sweep scripts under bench/ read back by column name.
#pragma once

#include <string>
#include <string_view>

namespace se::cli {

// `text` as one RFC 4180 field: as it is, or in double quotes with its own doubled when it holds a comma, a double
// quote or a line break (a model name, a method's JSON config).
std::string csv_field(std::string_view text);

// Appends `row` to the CSV file at `path`, writing `header` first when the file is new or empty.
void append_csv(const std::string& path, const std::string& header, const std::string& row);

}  // namespace se::cli
