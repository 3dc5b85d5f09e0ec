#include "structured/json_grammar.h"

#include <algorithm>
#include <array>
#include <string_view>

#include <fmt/format.h>

namespace se {

namespace {

constexpr std::array<std::string_view, 5> kAnnotations = {"title", "description", "$schema", "default", "examples"};

bool is_annotation(const std::string& key) {
  return std::find(kAnnotations.begin(), kAnnotations.end(), key) != kAnnotations.end();
}

// The keywords a schema of `type` may use besides the annotations.
std::vector<std::string_view> keywords_of(const std::string& type) {
  if (type == "object") return {"type", "properties", "required", "additionalProperties"};
  if (type == "array") return {"type", "items", "minItems", "maxItems"};
  return {"type"};
}

Status unsupported(const std::string& path, const std::string& what) {
  return invalid_argument(
      "{}: {} is not supported (supported: type object/array/string/number/integer/boolean/"
      "null, properties, required, items, minItems, maxItems, enum, const)",
      path, what);
}

Result<int32_t> count_of(const nlohmann::ordered_json& schema, const char* key, const std::string& path) {
  const nlohmann::ordered_json& v = schema[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 30))
    return invalid_argument("{}.{} must be a non-negative integer", path, key);
  return static_cast<int32_t>(v.get<int64_t>());
}

}  // namespace

JsonGrammar::JsonGrammar() {
  nodes_.push_back({.kind = GrammarNodeKind::kAny});
  nodes_.push_back({.kind = GrammarNodeKind::kObject, .open = true});
  nodes_.push_back({.kind = GrammarNodeKind::kArray, .items = kAnyNode});
  nodes_.push_back({.kind = GrammarNodeKind::kString});
  nodes_.push_back({.kind = GrammarNodeKind::kNumber});
  nodes_.push_back({.kind = GrammarNodeKind::kLiterals, .texts = {"true", "false"}});
  nodes_.push_back({.kind = GrammarNodeKind::kLiterals, .texts = {"null"}});
}

int32_t JsonGrammar::add(GrammarNode node) {
  nodes_.push_back(std::move(node));
  return static_cast<int32_t>(nodes_.size() - 1);
}

Result<JsonGrammar> JsonGrammar::from_schema(const nlohmann::ordered_json& schema) {
  JsonGrammar grammar;
  SE_ASSIGN_OR_RETURN(grammar.root_, grammar.compile(schema, "schema"));
  return grammar;
}

JsonGrammar JsonGrammar::any_object() {
  JsonGrammar grammar;
  grammar.root_ = kOpenObjectNode;
  return grammar;
}

Result<JsonGrammar> JsonGrammar::choice(const std::vector<Alternative>& alternatives) {
  if (alternatives.empty() || alternatives.size() > kMaxAlternatives)
    return invalid_argument("a choice needs 1 to {} alternatives, got {}", kMaxAlternatives, alternatives.size());
  JsonGrammar grammar;
  GrammarNode node{.kind = GrammarNodeKind::kChoice};
  for (const Alternative& a : alternatives) {
    if (a.prefix.empty() || a.suffix.empty()) return invalid_argument("a choice's prefix and suffix must be set");
    for (const std::string& other : node.texts)
      if (other.starts_with(a.prefix) || a.prefix.starts_with(other))
        return invalid_argument("choice prefixes must not be prefixes of each other: '{}'", a.prefix);
    SE_ASSIGN_OR_RETURN(int32_t value, grammar.compile(a.schema, "parameters"));
    node.texts.push_back(a.prefix);
    node.values.push_back(value);
    node.suffixes.push_back(a.suffix);
  }
  grammar.root_ = grammar.add(std::move(node));
  return grammar;
}

Result<int32_t> JsonGrammar::compile(const nlohmann::ordered_json& schema, const std::string& path) {
  if (schema.is_boolean() && schema.get<bool>()) return kAnyNode;
  if (!schema.is_object()) return invalid_argument("{} must be a JSON schema object", path);
  if (schema.contains("enum") || schema.contains("const")) {
    GrammarNode node{.kind = GrammarNodeKind::kLiterals};
    for (const auto& [key, value] : schema.items()) {
      if (key != "enum" && key != "const" && key != "type" && !is_annotation(key))
        return unsupported(path, "'" + key + "' next to enum/const");
    }
    if (schema.contains("const")) node.texts.push_back(schema["const"].dump());
    if (schema.contains("enum")) {
      const nlohmann::ordered_json& values = schema["enum"];
      if (!values.is_array() || values.empty()) return invalid_argument("{}.enum must be a non-empty list", path);
      for (const nlohmann::ordered_json& v : values) node.texts.push_back(v.dump());
    }
    if (node.texts.size() > kMaxAlternatives)
      return invalid_argument("{}: at most {} enum values are supported", path, kMaxAlternatives);
    return add(std::move(node));
  }
  if (!schema.contains("type")) {
    for (const auto& [key, value] : schema.items())
      if (!is_annotation(key)) return unsupported(path, "'" + key + "' without a 'type'");
    return kAnyNode;
  }
  const nlohmann::ordered_json& type_json = schema["type"];
  if (!type_json.is_string()) return unsupported(path + ".type", "a type that is not one string");
  const std::string type = type_json.get<std::string>();
  const std::vector<std::string_view> keywords = keywords_of(type);
  for (const auto& [key, value] : schema.items())
    if (!is_annotation(key) && std::find(keywords.begin(), keywords.end(), key) == keywords.end())
      return unsupported(path, fmt::format("keyword '{}' (type {})", key, type));

  if (type == "string") return kStringNode;
  if (type == "number") return kNumberNode;
  if (type == "integer") return add({.kind = GrammarNodeKind::kInteger});
  if (type == "boolean") return kBooleanNode;
  if (type == "null") return kNullNode;
  if (type == "array") {
    GrammarNode node{.kind = GrammarNodeKind::kArray, .items = kAnyNode};
    if (schema.contains("items")) {
      SE_ASSIGN_OR_RETURN(node.items, compile(schema["items"], path + ".items"));
    }
    if (schema.contains("minItems")) {
      SE_ASSIGN_OR_RETURN(node.min_items, count_of(schema, "minItems", path));
    }
    if (schema.contains("maxItems")) {
      SE_ASSIGN_OR_RETURN(node.max_items, count_of(schema, "maxItems", path));
    }
    if (node.max_items >= 0 && node.max_items < node.min_items)
      return invalid_argument("{}: maxItems is below minItems", path);
    return add(std::move(node));
  }
  if (type != "object") return unsupported(path + ".type", "type '" + type + "'");
  if (schema.contains("additionalProperties") && !schema["additionalProperties"].is_boolean())
    return unsupported(path + ".additionalProperties", "a schema here (only true or false)");
  const nlohmann::ordered_json properties = schema.value("properties", nlohmann::ordered_json::object());
  if (!properties.is_object()) return invalid_argument("{}.properties must be an object", path);
  if (properties.empty() && schema.value("additionalProperties", true)) return kOpenObjectNode;
  if (properties.size() > kMaxAlternatives)
    return invalid_argument("{}: at most {} properties are supported", path, kMaxAlternatives);
  std::vector<std::string> required;
  if (schema.contains("required")) {
    if (!schema["required"].is_array()) return invalid_argument("{}.required must be a list of names", path);
    for (const nlohmann::ordered_json& name : schema["required"]) {
      if (!name.is_string() || !properties.contains(name.get<std::string>()))
        return invalid_argument("{}.required names {}, which is not in its properties", path, name.dump());
      required.push_back(name.get<std::string>());
    }
  }
  GrammarNode node{.kind = GrammarNodeKind::kObject};
  for (const auto& [key, value] : properties.items()) {
    SE_ASSIGN_OR_RETURN(int32_t child, compile(value, fmt::format("{}.properties.{}", path, key)));
    node.keys.push_back(nlohmann::ordered_json(key).dump() + ":");
    node.values.push_back(child);
    node.required.push_back(std::find(required.begin(), required.end(), key) != required.end());
  }
  return add(std::move(node));
}

}  // namespace se
