// JsonGrammar: the JSON texts a constrained generation may write, as a graph of nodes compiled from a JSON
// schema (response_format json_schema), any JSON object (json_object), or tool calls (a literal prefix naming
// the function, its parameters' schema, a literal suffix). Output is compact JSON: no whitespace between tokens,
// object properties in the schema's order (optional ones may be left out). Immutable after compiling; shared
// by every request that uses it.
//
// The supported schema subset: type object (properties, required, additionalProperties as a boolean: no extra
// properties are written either way), array (items, minItems, maxItems), string, number, integer, boolean, null;
// enum and const (any JSON values); nesting. Annotations (title, description, $schema, default, examples) are
// ignored. Any other keyword, or a type list, is an error naming it.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace se {

enum class GrammarNodeKind : uint8_t {
  kAny,       // any JSON value: dispatches on its first byte
  kObject,    // schema object: properties in order; `open` = any keys with kAny values
  kArray,     // items of one node
  kString,    // any JSON string
  kNumber,    // a JSON number
  kInteger,   // -?(0|[1-9][0-9]*)
  kLiterals,  // one of a few exact texts (enum, const, true/false, null)
  kChoice,    // one of several (prefix, node, suffix) alternatives, told apart by their prefixes
};

struct GrammarNode {
  GrammarNodeKind kind = GrammarNodeKind::kAny;
  // kObject
  bool open = false;
  std::vector<std::string> keys;  // each property's `"key":` text
  std::vector<int32_t> values;    // each property's node
  std::vector<bool> required;
  // kArray
  int32_t items = -1;
  int32_t min_items = 0;
  int32_t max_items = -1;  // -1 = unbounded
  // kLiterals: the texts; kChoice: the prefixes, with `values` the nodes and `suffixes` what follows each
  std::vector<std::string> texts;
  std::vector<std::string> suffixes;
};

class JsonGrammar {
 public:
  // Most alternatives a kLiterals or kChoice node, or properties a kObject node, may have.
  static constexpr size_t kMaxAlternatives = 64;

  // Errors: kInvalidArgument naming the schema path and the keyword.
  static Result<JsonGrammar> from_schema(const nlohmann::ordered_json& schema);
  static JsonGrammar any_object();
  // One of `calls`: each a (prefix, parameters schema, suffix). Errors as from_schema.
  struct Alternative {
    std::string prefix;
    nlohmann::ordered_json schema;
    std::string suffix;
  };
  static Result<JsonGrammar> choice(const std::vector<Alternative>& alternatives);

  const GrammarNode& node(int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  int32_t root() const { return root_; }
  // The shared nodes every grammar has, for values of any shape.
  static constexpr int32_t kAnyNode = 0, kOpenObjectNode = 1, kOpenArrayNode = 2, kStringNode = 3, kNumberNode = 4,
                           kBooleanNode = 5, kNullNode = 6;

 private:
  JsonGrammar();
  int32_t add(GrammarNode node);
  Result<int32_t> compile(const nlohmann::ordered_json& schema, const std::string& path);

  std::vector<GrammarNode> nodes_;
  int32_t root_ = kAnyNode;
};

}  // namespace se
