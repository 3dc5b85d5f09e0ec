#include "chat/jinja/template.h"

#include "chat/jinja/json_value.h"
#include "chat/jinja/parser.h"

namespace se::jinja {

Result<Template> Template::parse(std::string_view source) {
  SE_ASSIGN_OR_RETURN(std::unique_ptr<ast::Program> program, parse_template(source));
  return Template(std::shared_ptr<const ast::Program>(std::move(program)));
}

Result<std::string> Template::render(const nlohmann::ordered_json& variables,
                                     const RenderOptions& options) const {
  if (!variables.is_object()) return invalid_argument("template variables must be a JSON object");
  SE_ASSIGN_OR_RETURN(Value converted, value_from_json(variables, options.limits.max_nesting));
  return render(converted.as_dict(), options);
}

Result<std::string> Template::render(const Dict& variables, const RenderOptions& options) const {
  std::tm now{};
  if (options.now) {
    now = *options.now;
  } else {
    std::time_t t = std::time(nullptr);
    localtime_r(&t, &now);
  }
  Interpreter interpreter(*program_, options.limits, now);
  return interpreter.render(variables);
}

}  // namespace se::jinja
