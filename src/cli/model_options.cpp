#include "cli/model_options.h"

#include <cstdio>

#include "cli/model_resolver.h"

namespace se::cli {

void ModelOptions::add_to(CLI::App& command) {
  command.add_option("--model,-m", model, "model: 'default' (SmolLM2-135M-Instruct), a .gguf file, an HF directory, "
                                          "or with --load-format dummy a config.json")
      ->capture_default_str();
  command.add_option("--load-format", load_format, "auto | gguf | safetensors | dummy")->capture_default_str();
  command.add_option("--dummy-seed", dummy_seed, "seed of --load-format dummy weights")->capture_default_str();
}

Result<ModelBundle> ModelOptions::load(Device device, int tensor_parallel_size) const {
  SE_ASSIGN_OR_RETURN(std::string path, resolve_model_path(model));
  LoadOptions options;
  SE_ASSIGN_OR_RETURN(options.format, parse_load_format(load_format));
  options.seed = dummy_seed;
  SE_ASSIGN_OR_RETURN(ModelBundle bundle, ModelBundle::load(path, options, device, tensor_parallel_size));
  if (model == kDefaultModelName) bundle.name = "default";
  return bundle;
}

int report_error(const Status& status) {
  std::fprintf(stderr, "error: %s\n", status.message().c_str());
  return 1;
}

}  // namespace se::cli
