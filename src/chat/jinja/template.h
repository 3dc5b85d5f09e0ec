// jinja::Template: a parsed Jinja template that renders like Python jinja2 configured as HF
// transformers configures it for chat templates (ImmutableSandboxedEnvironment, trim_blocks,
// lstrip_blocks, loop controls, transformers' tojson / raise_exception / strftime_now / dict /
// namespace). Immutable after parse; render() may run concurrently from many threads.
#pragma once

#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "chat/jinja/interpreter.h"
#include "chat/jinja/value.h"

namespace se::jinja {

struct RenderOptions {
  RenderLimits limits;
  // The local time strftime_now() formats; nullopt uses the current local time.
  std::optional<std::tm> now;
};

class Template {
 public:
  // Parse errors are kInvalidArgument with "line L, column C: message".
  static Result<Template> parse(std::string_view source);

  // `variables` must be a JSON object; its keys become template variables.
  Result<std::string> render(const nlohmann::ordered_json& variables,
                             const RenderOptions& options = {}) const;
  // Variables already converted to Values (string keys).
  Result<std::string> render(const Dict& variables, const RenderOptions& options = {}) const;

 private:
  explicit Template(std::shared_ptr<const ast::Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const ast::Program> program_;
};

}  // namespace se::jinja
