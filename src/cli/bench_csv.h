// The CSV rows the engine benchmarks append (`bench decode --csv`, `bench throughput --csv`): one file collects the
// rows of many runs, which the sweep scripts under bench/ read back by column name.
#pragma once

#include <string>

namespace se::cli {

// A CSV field's text with its double quotes doubled (the caller quotes the field).
std::string csv_escaped(const std::string& text);

// Appends `row` to the CSV file at `path`, writing `header` first when the file is new or empty.
void append_csv(const std::string& path, const std::string& header, const std::string& row);

}  // namespace se::cli
