#include "tokenizer/tokenizer_json.h"

#include <nlohmann/json.hpp>

#include "base/mapped_file.h"

namespace se {
namespace {

using Json = nlohmann::json;

// Field access with errors that name the file and the JSON path.
class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  const std::string& file() const { return file_; }

  Status error(std::string_view path, std::string_view what) const {
    return invalid_argument("{}: '{}' {}", file_, path, what);
  }
  Status unsupported(std::string_view path, std::string_view what) const {
    return unimplemented("{}: '{}': {} is not supported", file_, path, what);
  }

  // The member, or null when absent.
  static const Json* member(const Json& obj, std::string_view key) {
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }

  Result<const Json*> object(const Json& obj, std::string_view key, std::string_view path) const {
    const Json* v = member(obj, key);
    if (v == nullptr) return error(path, "is missing");
    if (!v->is_object()) return error(path, "should be an object");
    return v;
  }

  Result<std::string> string(const Json& obj, std::string_view key, std::string_view path) const {
    const Json* v = member(obj, key);
    if (v == nullptr) return error(path, "is missing");
    if (!v->is_string()) return error(path, "should be a string");
    return v->get<std::string>();
  }

  Result<bool> boolean(const Json& obj, std::string_view key, bool fallback,
                       std::string_view path) const {
    const Json* v = member(obj, key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) return error(path, "should be true or false");
    return v->get<bool>();
  }

  Result<int64_t> integer(const Json& obj, std::string_view key, std::string_view path) const {
    const Json* v = member(obj, key);
    if (v == nullptr) return error(path, "is missing");
    if (!v->is_number_integer()) return error(path, "should be an integer");
    return v->get<int64_t>();
  }

  Result<Json> parse_file(const std::string& path) const {
    SE_ASSIGN_OR_RETURN(std::string text, read_file(path));
    try {
      return Json::parse(text);
    } catch (const Json::parse_error& e) {
      return invalid_argument("{}: not valid JSON: {}", path, e.what());
    }
  }

 private:
  std::string file_;
};

// {"String": "..."} or {"Regex": "..."}: the literal, or the regex in regex_out.
Status read_pattern(const Reader& r, const Json& obj, std::string_view path, std::string& literal,
                    std::vector<Regex>& regex_out) {
  SE_ASSIGN_OR_RETURN(const Json* pattern, r.object(obj, "pattern", path));
  if (const Json* s = Reader::member(*pattern, "String"); s != nullptr && s->is_string()) {
    literal = s->get<std::string>();
    return Status::ok();
  }
  if (const Json* s = Reader::member(*pattern, "Regex"); s != nullptr && s->is_string()) {
    Result<Regex> regex = Regex::compile(s->get<std::string>());
    if (!regex.is_ok()) return regex.status().with_context(r.file());
    regex_out.push_back(std::move(regex).value());
    return Status::ok();
  }
  return r.error(path, "should hold a \"String\" or a \"Regex\"");
}

Status read_model(const Reader& r, const Json& root, TokenizerSpec& spec) {
  SE_ASSIGN_OR_RETURN(const Json* model, r.object(root, "model", "model"));
  const Json* type = Reader::member(*model, "type");
  if (type != nullptr && (!type->is_string() || type->get<std::string>() != "BPE")) {
    return r.unsupported("model.type", type->dump());
  }
  SE_ASSIGN_OR_RETURN(const Json* vocab, r.object(*model, "vocab", "model.vocab"));
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      return r.error("model.vocab",
                     fmt::format("maps '{}' to {}, not a token id", token, id.dump()));
    }
    spec.model_vocab->set(static_cast<int32_t>(id.get<int64_t>()), token);
  }
  const Json* merges = Reader::member(*model, "merges");
  if (merges == nullptr || !merges->is_array())
    return r.error("model.merges", "should be an array");
  spec.merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& m = (*merges)[i];
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return r.error(fmt::format("model.merges[{}]", i),
                       "should be two tokens separated by a space");
      }
      spec.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      spec.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return r.error(fmt::format("model.merges[{}]", i), "should be \"a b\" or [\"a\", \"b\"]");
    }
  }
  SE_ASSIGN_OR_RETURN(spec.bpe.byte_fallback,
                      r.boolean(*model, "byte_fallback", false, "model.byte_fallback"));
  SE_ASSIGN_OR_RETURN(spec.bpe.fuse_unk, r.boolean(*model, "fuse_unk", false, "model.fuse_unk"));
  SE_ASSIGN_OR_RETURN(spec.bpe.ignore_merges,
                      r.boolean(*model, "ignore_merges", false, "model.ignore_merges"));
  if (Reader::member(*model, "unk_token") != nullptr) {
    SE_ASSIGN_OR_RETURN(std::string unk, r.string(*model, "unk_token", "model.unk_token"));
    auto id = spec.model_vocab->find(unk);
    if (!id) return r.error("model.unk_token", fmt::format("'{}' is not in model.vocab", unk));
    spec.bpe.unk_id = *id;
  }
  for (std::string_view key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Json* v = Reader::member(*model, key);
    if (v != nullptr && !(v->is_string() && v->get<std::string>().empty())) {
      return r.unsupported(fmt::format("model.{}", key), v->dump());
    }
  }
  if (const Json* dropout = Reader::member(*model, "dropout");
      dropout != nullptr && !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    return r.unsupported("model.dropout", dropout->dump());
  }
  return Status::ok();
}

Status read_normalizer(const Reader& r, const Json& n, std::string_view path, Normalizer& out) {
  SE_ASSIGN_OR_RETURN(std::string type, r.string(n, "type", fmt::format("{}.type", path)));
  if (type == "Sequence") {
    const Json* steps = Reader::member(n, "normalizers");
    if (steps == nullptr || !steps->is_array()) return r.error(path, "needs a 'normalizers' array");
    for (size_t i = 0; i < steps->size(); ++i) {
      SE_RETURN_IF_ERROR(
          read_normalizer(r, (*steps)[i], fmt::format("{}.normalizers[{}]", path, i), out));
    }
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    const Normalizer::Form form = type == "NFC"    ? Normalizer::Form::kNfc
                                  : type == "NFD"  ? Normalizer::Form::kNfd
                                  : type == "NFKC" ? Normalizer::Form::kNfkc
                                                   : Normalizer::Form::kNfkd;
    out.add(Normalizer::UnicodeForm{form});
  } else if (type == "Lowercase") {
    out.add(Normalizer::Lowercase{});
  } else if (type == "Replace") {
    Normalizer::Replace step;
    SE_RETURN_IF_ERROR(read_pattern(r, n, path, step.literal, step.regex));
    SE_ASSIGN_OR_RETURN(step.content, r.string(n, "content", fmt::format("{}.content", path)));
    out.add(std::move(step));
  } else if (type == "Prepend") {
    SE_ASSIGN_OR_RETURN(std::string prefix,
                        r.string(n, "prepend", fmt::format("{}.prepend", path)));
    out.add(Normalizer::Prepend{std::move(prefix)});
  } else {
    return r.unsupported(path, fmt::format("normalizer type '{}'", type));
  }
  return Status::ok();
}

Result<PreTokenizer::Behavior> read_behavior(const Reader& r, const Json& p,
                                             std::string_view path) {
  SE_ASSIGN_OR_RETURN(std::string b, r.string(p, "behavior", fmt::format("{}.behavior", path)));
  using B = PreTokenizer::Behavior;
  if (b == "Isolated") return B::kIsolated;
  if (b == "Removed") return B::kRemoved;
  if (b == "MergedWithPrevious") return B::kMergedWithPrevious;
  if (b == "MergedWithNext") return B::kMergedWithNext;
  if (b == "Contiguous") return B::kContiguous;
  return r.error(fmt::format("{}.behavior", path), fmt::format("'{}' is not a split behavior", b));
}

Status read_pre_tokenizer(const Reader& r, const Json& p, std::string_view path,
                          PreTokenizer& out) {
  SE_ASSIGN_OR_RETURN(std::string type, r.string(p, "type", fmt::format("{}.type", path)));
  Status added;
  if (type == "Sequence") {
    const Json* steps = Reader::member(p, "pretokenizers");
    if (steps == nullptr || !steps->is_array())
      return r.error(path, "needs a 'pretokenizers' array");
    for (size_t i = 0; i < steps->size(); ++i) {
      SE_RETURN_IF_ERROR(
          read_pre_tokenizer(r, (*steps)[i], fmt::format("{}.pretokenizers[{}]", path, i), out));
    }
    return Status::ok();
  } else if (type == "Split") {
    PreTokenizer::Split split;
    SE_RETURN_IF_ERROR(read_pattern(r, p, path, split.literal, split.regex));
    SE_ASSIGN_OR_RETURN(split.behavior, read_behavior(r, p, path));
    SE_ASSIGN_OR_RETURN(split.invert,
                        r.boolean(p, "invert", false, fmt::format("{}.invert", path)));
    added = out.add(std::move(split));
  } else if (type == "Digits") {
    SE_ASSIGN_OR_RETURN(bool individual, r.boolean(p, "individual_digits", false,
                                                   fmt::format("{}.individual_digits", path)));
    added = out.add(PreTokenizer::digits(individual));
  } else if (type == "ByteLevel") {
    PreTokenizer::ByteLevel b;
    SE_ASSIGN_OR_RETURN(b.add_prefix_space, r.boolean(p, "add_prefix_space", true,
                                                      fmt::format("{}.add_prefix_space", path)));
    SE_ASSIGN_OR_RETURN(b.use_regex,
                        r.boolean(p, "use_regex", true, fmt::format("{}.use_regex", path)));
    added = out.add(b);
  } else {
    return r.unsupported(path, fmt::format("pre-tokenizer type '{}'", type));
  }
  if (!added.is_ok()) return added.with_context(fmt::format("{}: '{}'", r.file(), path));
  return Status::ok();
}

Status read_decoder(const Reader& r, const Json& d, std::string_view path, bool& fused,
                    DecoderSpec& out) {
  SE_ASSIGN_OR_RETURN(std::string type, r.string(d, "type", fmt::format("{}.type", path)));
  if (type == "Sequence") {
    const Json* steps = Reader::member(d, "decoders");
    if (steps == nullptr || !steps->is_array()) return r.error(path, "needs a 'decoders' array");
    for (size_t i = 0; i < steps->size(); ++i) {
      SE_RETURN_IF_ERROR(
          read_decoder(r, (*steps)[i], fmt::format("{}.decoders[{}]", path, i), fused, out));
    }
  } else if (type == "ByteLevel") {
    out.byte_level = true;
  } else if (type == "ByteFallback") {
    out.byte_fallback = true;
  } else if (type == "Fuse") {
    fused = true;
  } else if (type == "Replace") {
    std::string literal;
    std::vector<Regex> regex;
    SE_RETURN_IF_ERROR(read_pattern(r, d, path, literal, regex));
    if (!regex.empty()) return r.unsupported(path, "a regex Replace decoder");
    SE_ASSIGN_OR_RETURN(std::string content,
                        r.string(d, "content", fmt::format("{}.content", path)));
    out.replacements.emplace_back(std::move(literal), std::move(content));
  } else if (type == "Strip") {
    SE_ASSIGN_OR_RETURN(std::string content,
                        r.string(d, "content", fmt::format("{}.content", path)));
    SE_ASSIGN_OR_RETURN(int64_t start, r.integer(d, "start", fmt::format("{}.start", path)));
    SE_ASSIGN_OR_RETURN(int64_t stop, r.integer(d, "stop", fmt::format("{}.stop", path)));
    // Only the SentencePiece shape: strip leading spaces of the fused text.
    if (content != " " || stop != 0 || !fused || start < 0 || start > 64) {
      return r.unsupported(path, "a Strip decoder other than leading spaces after Fuse");
    }
    out.strip_leading_spaces = static_cast<int>(start);
  } else {
    return r.unsupported(path, fmt::format("decoder type '{}'", type));
  }
  return Status::ok();
}

// TemplateProcessing's single-sequence template: special token ids before and after "$A".
Status read_post_processor(const Reader& r, const Json& p, std::string_view path,
                           TokenizerSpec& spec) {
  SE_ASSIGN_OR_RETURN(std::string type, r.string(p, "type", fmt::format("{}.type", path)));
  if (type == "Sequence") {
    const Json* steps = Reader::member(p, "processors");
    if (steps == nullptr || !steps->is_array()) return r.error(path, "needs a 'processors' array");
    for (size_t i = 0; i < steps->size(); ++i) {
      SE_RETURN_IF_ERROR(
          read_post_processor(r, (*steps)[i], fmt::format("{}.processors[{}]", path, i), spec));
    }
    return Status::ok();
  }
  if (type == "ByteLevel") return Status::ok();  // only adjusts offsets
  if (type != "TemplateProcessing")
    return r.unsupported(path, fmt::format("post-processor type '{}'", type));
  const Json* single = Reader::member(p, "single");
  if (single == nullptr || !single->is_array())
    return r.error(fmt::format("{}.single", path), "should be an array");
  const Json* specials = Reader::member(p, "special_tokens");
  bool after_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& item = (*single)[i];
    const std::string item_path = fmt::format("{}.single[{}]", path, i);
    if (Reader::member(item, "Sequence") != nullptr) {
      after_sequence = true;
      continue;
    }
    const Json* special = Reader::member(item, "SpecialToken");
    if (special == nullptr) return r.error(item_path, "should be a Sequence or a SpecialToken");
    SE_ASSIGN_OR_RETURN(std::string name, r.string(*special, "id", item_path + ".SpecialToken.id"));
    const Json* entry = specials != nullptr ? Reader::member(*specials, name) : nullptr;
    const Json* ids = entry != nullptr ? Reader::member(*entry, "ids") : nullptr;
    if (ids == nullptr || !ids->is_array()) {
      return r.error(fmt::format("{}.special_tokens", path),
                     fmt::format("has no ids for '{}'", name));
    }
    for (const Json& id : *ids) {
      if (!id.is_number_integer())
        return r.error(fmt::format("{}.special_tokens.{}", path, name), "has a non-integer id");
      (after_sequence ? spec.suffix_ids : spec.prefix_ids).push_back(id.get<int32_t>());
    }
  }
  return Status::ok();
}

Status read_added_tokens(const Reader& r, const Json& root, TokenizerSpec& spec) {
  const Json* added = Reader::member(root, "added_tokens");
  if (added == nullptr) return Status::ok();
  if (!added->is_array()) return r.error("added_tokens", "should be an array");
  for (size_t i = 0; i < added->size(); ++i) {
    const Json& t = (*added)[i];
    const std::string path = fmt::format("added_tokens[{}]", i);
    if (!t.is_object()) return r.error(path, "should be an object");
    AddedToken token;
    SE_ASSIGN_OR_RETURN(int64_t id, r.integer(t, "id", path + ".id"));
    if (id < 0 || id > INT32_MAX) return r.error(path + ".id", "is not a token id");
    token.id = static_cast<int32_t>(id);
    SE_ASSIGN_OR_RETURN(token.content, r.string(t, "content", path + ".content"));
    SE_ASSIGN_OR_RETURN(token.special, r.boolean(t, "special", false, path + ".special"));
    SE_ASSIGN_OR_RETURN(token.single_word,
                        r.boolean(t, "single_word", false, path + ".single_word"));
    SE_ASSIGN_OR_RETURN(token.lstrip, r.boolean(t, "lstrip", false, path + ".lstrip"));
    SE_ASSIGN_OR_RETURN(token.rstrip, r.boolean(t, "rstrip", false, path + ".rstrip"));
    SE_ASSIGN_OR_RETURN(token.normalized,
                        r.boolean(t, "normalized", !token.special, path + ".normalized"));
    spec.added_tokens.push_back(std::move(token));
  }
  return Status::ok();
}

// "<bos>" or {"content": "<bos>", ...}; nullopt when absent or null.
Result<std::optional<std::string>> token_content(const Reader& r, const Json& config,
                                                 std::string_view key) {
  const Json* v = Reader::member(config, key);
  if (v == nullptr) return std::optional<std::string>();
  if (v->is_string()) return std::optional<std::string>(v->get<std::string>());
  if (v->is_object()) {
    SE_ASSIGN_OR_RETURN(std::string content,
                        r.string(*v, "content", fmt::format("{}.content", key)));
    return std::optional<std::string>(std::move(content));
  }
  return r.error(key, "should be a string or an object with 'content'");
}

Status read_config(const std::string& path, TokenizerSpec& spec) {
  const Reader r(path);
  SE_ASSIGN_OR_RETURN(Json config, r.parse_file(path));
  if (!config.is_object()) return invalid_argument("{}: should hold a JSON object", path);
  auto find_id = [&](const std::string& content) -> std::optional<int32_t> {
    for (const AddedToken& t : spec.added_tokens) {
      if (t.content == content) return t.id;
    }
    return spec.model_vocab->find(content);
  };
  for (const auto& [key, target] :
       {std::pair<std::string_view, std::optional<int32_t>*>{"bos_token", &spec.bos_id},
        {"eos_token", &spec.eos_id}}) {
    SE_ASSIGN_OR_RETURN(std::optional<std::string> content, token_content(r, config, key));
    if (!content) continue;
    auto id = find_id(*content);
    if (!id) return r.error(key, fmt::format("'{}' is not a token of the tokenizer", *content));
    *target = id;
  }
  if (Reader::member(config, "add_bos_token") != nullptr) {
    SE_ASSIGN_OR_RETURN(bool add, r.boolean(config, "add_bos_token", false, "add_bos_token"));
    if (add && !spec.bos_id) return r.error("add_bos_token", "is true but there is no bos_token");
    spec.prefix_ids.clear();
    if (add) spec.prefix_ids.push_back(*spec.bos_id);
  }
  if (Reader::member(config, "add_eos_token") != nullptr) {
    SE_ASSIGN_OR_RETURN(bool add, r.boolean(config, "add_eos_token", false, "add_eos_token"));
    if (add && !spec.eos_id) return r.error("add_eos_token", "is true but there is no eos_token");
    spec.suffix_ids.clear();
    if (add) spec.suffix_ids.push_back(*spec.eos_id);
  }
  if (const Json* t = Reader::member(config, "chat_template")) {
    if (t->is_string()) {
      spec.chat_template = t->get<std::string>();
    } else if (t->is_array()) {
      // Named templates: the "default" one, else the first.
      for (const Json& entry : *t) {
        const Json* name = Reader::member(entry, "name");
        const Json* body = Reader::member(entry, "template");
        if (body == nullptr || !body->is_string())
          return r.error("chat_template", "has an entry without a template");
        if (spec.chat_template.empty() || (name != nullptr && *name == "default")) {
          spec.chat_template = body->get<std::string>();
        }
      }
    } else {
      return r.error("chat_template", "should be a string or a list of named templates");
    }
  }
  return Status::ok();
}

}  // namespace

Result<TokenizerSpec> tokenizer_spec_from_hf_files(const std::string& tokenizer_json_path,
                                                   const std::string& config_path) {
  TokenizerSpec spec;
  spec.source = tokenizer_json_path;
  const Reader r(tokenizer_json_path);
  SE_ASSIGN_OR_RETURN(Json root, r.parse_file(tokenizer_json_path));
  if (!root.is_object())
    return invalid_argument("{}: should hold a JSON object", tokenizer_json_path);
  SE_RETURN_IF_ERROR(read_model(r, root, spec));
  if (const Json* n = Reader::member(root, "normalizer")) {
    SE_RETURN_IF_ERROR(read_normalizer(r, *n, "normalizer", spec.normalizer));
  }
  if (const Json* p = Reader::member(root, "pre_tokenizer")) {
    SE_RETURN_IF_ERROR(read_pre_tokenizer(r, *p, "pre_tokenizer", spec.pre_tokenizer));
  }
  const Json* decoder = Reader::member(root, "decoder");
  if (decoder == nullptr) return r.unsupported("decoder", "a missing decoder");
  bool fused = false;
  SE_RETURN_IF_ERROR(read_decoder(r, *decoder, "decoder", fused, spec.decoder));
  if (const Json* p = Reader::member(root, "post_processor")) {
    SE_RETURN_IF_ERROR(read_post_processor(r, *p, "post_processor", spec));
  }
  SE_RETURN_IF_ERROR(read_added_tokens(r, root, spec));
  if (spec.prefix_ids.size() == 1) spec.bos_id = spec.prefix_ids.front();
  if (spec.suffix_ids.size() == 1) spec.eos_id = spec.suffix_ids.front();
  if (!config_path.empty()) SE_RETURN_IF_ERROR(read_config(config_path, spec));
  return spec;
}

}  // namespace se
