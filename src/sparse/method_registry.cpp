#include "sparse/method_registry.h"

#include "sparse/methods/vanilla.h"

namespace se {

namespace {
using Factory = Result<std::unique_ptr<MethodRuntime>> (*)(const nlohmann::json&);

struct Entry {
  MethodInfo info;
  Factory create;
};

const std::vector<Entry>& entries() {
  static const std::vector<Entry> kEntries = {
      {{"vanilla", "dense attention over every token; radix prefix cache"}, &VanillaMethod::create},
  };
  return kEntries;
}
}  // namespace

const std::vector<MethodInfo>& registered_methods() {
  static const std::vector<MethodInfo> kInfos = [] {
    std::vector<MethodInfo> infos;
    for (const Entry& e : entries()) infos.push_back(e.info);
    return infos;
  }();
  return kInfos;
}

Result<std::unique_ptr<MethodRuntime>> create_method(const std::string& name, const nlohmann::json& config) {
  std::string known;
  for (const Entry& e : entries()) {
    if (e.info.name == name) return e.create(config);
    known += (known.empty() ? "" : ", ") + e.info.name;
  }
  return invalid_argument("unknown --sparse-method '{}' (known: {})", name, known);
}

}  // namespace se
