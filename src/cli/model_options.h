// The model-selection flags every subcommand shares (--model, --load-format, --seed for dummy weights) and the
// loading they lead to.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "engine/model_bundle.h"

namespace se::cli {

struct ModelOptions {
  std::string model = "default";
  std::string load_format = "auto";
  uint64_t dummy_seed = 0;

  void add_to(CLI::App& command);
  // Resolves "default", parses --load-format and loads the bundle with its weights on `device`, split over
  // `tensor_parallel_size` ranks; errors are ready to print.
  Result<ModelBundle> load(Device device = Device::kCpu, int tensor_parallel_size = 1) const;
};

// Prints "error: <message>" to stderr and returns 1.
int report_error(const Status& status);

}  // namespace se::cli
