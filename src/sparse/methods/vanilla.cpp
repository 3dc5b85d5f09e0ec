#include "sparse/methods/vanilla.h"

namespace se {

Result<std::unique_ptr<MethodRuntime>> VanillaMethod::create(const nlohmann::json& config) {
  SE_ASSIGN_OR_RETURN(MethodConfig reader, MethodConfig::parse("vanilla", config));
  SE_RETURN_IF_ERROR(reader.finish());
  return std::unique_ptr<MethodRuntime>(new VanillaMethod(reader.resolved()));
}

}  // namespace se
