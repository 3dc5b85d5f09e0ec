#include "chat/jinja/builtin_args.h"

#include "chat/jinja/operators.h"

namespace se::jinja {

Result<std::vector<Value>> bind_args(std::string_view function, const CallArgs& args,
                                     std::initializer_list<Param> params) {
  std::vector<std::optional<Value>> bound(params.size());
  if (args.positional.size() > params.size()) {
    return type_error(fmt::format("{}() takes at most {} argument(s) ({} given)", function,
                                  params.size(), args.positional.size()));
  }
  for (size_t i = 0; i < args.positional.size(); ++i) bound[i] = args.positional[i];
  for (const auto& [key, value] : args.keyword) {
    size_t i = 0;
    for (const Param& p : params) {
      if (p.name == key) break;
      ++i;
    }
    if (i == params.size()) {
      return type_error(fmt::format("{}() got an unexpected keyword argument '{}'", function, key));
    }
    if (bound[i]) {
      return type_error(fmt::format("{}() got multiple values for argument '{}'", function, key));
    }
    bound[i] = value;
  }
  std::vector<Value> out;
  out.reserve(params.size());
  size_t i = 0;
  for (const Param& p : params) {
    if (bound[i]) {
      out.push_back(std::move(*bound[i]));
    } else if (p.default_value) {
      out.push_back(*p.default_value);
    } else {
      return type_error(fmt::format("{}() missing required argument '{}'", function, p.name));
    }
    ++i;
  }
  return out;
}

}  // namespace se::jinja
