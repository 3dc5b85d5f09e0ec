#include "tokenizer/gguf_vocab.h"

#include <algorithm>
#include <numeric>

#include "loader/gguf_file.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace se {
namespace {

// llama.cpp's token types (tokenizer.ggml.token_type).
constexpr int32_t kTypeControl = 3;
constexpr int32_t kTypeUserDefined = 4;

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581

constexpr std::string_view kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen35Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

bool one_of(std::string_view name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// A key that may be absent: nullopt then; an error when present with the wrong type.
template <typename T>
Result<std::optional<T>> optional_key(const GgufFile& gguf, std::string_view key,
                                      std::optional<T> value, std::string_view expected) {
  if (value) return value;
  const GgufValue* v = gguf.find(key);
  if (v == nullptr) return std::optional<T>();
  return invalid_argument("{}: metadata '{}' should be {}, got {} {}", gguf.path(), key, expected,
                          gguf_value_type_name(v->type()), v->describe());
}

template <typename T>
Result<T> required_key(const GgufFile& gguf, std::string_view key, std::optional<T> value,
                       std::string_view expected) {
  SE_ASSIGN_OR_RETURN(std::optional<T> v, optional_key(gguf, key, std::move(value), expected));
  if (!v) return not_found("{}: missing metadata key '{}'", gguf.path(), key);
  return *std::move(v);
}

Result<std::optional<int32_t>> token_id_key(const GgufFile& gguf, std::string_view key,
                                            size_t num_tokens) {
  SE_ASSIGN_OR_RETURN(std::optional<uint32_t> id,
                      optional_key(gguf, key, gguf.find_u32(key), "an unsigned 32-bit integer"));
  if (!id) return std::optional<int32_t>();
  if (*id >= num_tokens) {
    return invalid_argument("{}: metadata '{}' = {} is past the vocabulary ({} tokens)",
                            gguf.path(), key, *id, num_tokens);
  }
  return std::optional<int32_t>(static_cast<int32_t>(*id));
}

bool is_all_spaces(std::string_view token) {
  return !token.empty() && std::all_of(token.begin(), token.end(), [](char c) { return c == ' '; });
}

Status fill_byte_level_bpe(const GgufFile& gguf, const std::vector<std::string>& tokens,
                           TokenizerSpec& spec) {
  // A spelling outside the byte alphabet stands for its UTF-8 bytes (as transformers reads it).
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string& t = tokens[id];
    spec.model_vocab->set(static_cast<int32_t>(id),
                          byte_level::in_alphabet(t) ? t : byte_level::encode(t));
  }
  SE_ASSIGN_OR_RETURN(
      std::vector<std::string> merges,
      required_key(gguf, "tokenizer.ggml.merges", gguf.find_string_array("tokenizer.ggml.merges"),
                   "an array of strings"));
  spec.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const size_t space = merges[i].find(' ', 1);
    if (space == std::string::npos) {
      return invalid_argument(
          "{}: tokenizer.ggml.merges[{}] '{}' is not two tokens separated by a space", gguf.path(),
          i, merges[i]);
    }
    spec.merges.emplace_back(merges[i].substr(0, space), merges[i].substr(space + 1));
  }
  SE_ASSIGN_OR_RETURN(
      std::optional<std::string> pre,
      optional_key(gguf, "tokenizer.ggml.pre", gguf.find_string("tokenizer.ggml.pre"), "a string"));
  Result<GgufPreTokenizer> pre_tokenizer = gguf_pre_tokenizer(pre.value_or("default"));
  if (!pre_tokenizer.is_ok()) return pre_tokenizer.status().with_context(gguf.path());
  for (const std::string& pattern : pre_tokenizer->regexes) {
    SE_ASSIGN_OR_RETURN(PreTokenizer::Split split,
                        PreTokenizer::regex_split(pattern, PreTokenizer::Behavior::kIsolated));
    SE_RETURN_IF_ERROR(spec.pre_tokenizer.add(std::move(split)));
  }
  spec.bpe.ignore_merges = pre_tokenizer->ignore_merges;
  SE_RETURN_IF_ERROR(spec.pre_tokenizer.add(PreTokenizer::ByteLevel{false, false}));
  spec.decoder.byte_level = true;
  return Status::ok();
}

Status fill_sentencepiece_bpe(const GgufFile& gguf, const std::vector<std::string>& tokens,
                              TokenizerSpec& spec, std::vector<bool>& respelled) {
  const std::string arch = gguf.architecture();
  const bool gemma = one_of(arch, {"gemma", "gemma2", "gemma3"});
  const size_t n = tokens.size();
  for (size_t id = 0; id < n; ++id) {
    std::string t = tokens[id];
    // Gemma stores tokens of 2+ spaces with real spaces; everything else spells them U+2581.
    if (gemma && t.size() >= 2 && is_all_spaces(t)) {
      std::string spelled;
      for (size_t i = 0; i < t.size(); ++i) spelled += kSpaceMarker;
      t = std::move(spelled);
      respelled[id] = true;
    }
    spec.model_vocab->set(static_cast<int32_t>(id), std::move(t));
  }
  // No merges are stored: a pair merges when it spells a token. Gemma's merge order is the token
  // order (its scores do not follow it); elsewhere a higher score merges first.
  std::vector<uint32_t> priority(n);
  if (gemma) {
    std::iota(priority.begin(), priority.end(), 0u);
  } else {
    SE_ASSIGN_OR_RETURN(
        std::vector<float> scores,
        required_key(gguf, "tokenizer.ggml.scores", gguf.find_f32_array("tokenizer.ggml.scores"),
                     "an array of floats"));
    if (scores.size() < n) {
      return invalid_argument("{}: tokenizer.ggml.scores has {} entries for {} tokens", gguf.path(),
                              scores.size(), n);
    }
    std::vector<uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return scores[a] > scores[b]; });
    for (uint32_t rank = 0; rank < n; ++rank) priority[order[rank]] = rank;
  }
  spec.merge_priority = std::move(priority);
  spec.bpe.byte_fallback = true;
  spec.bpe.fuse_unk = true;
  SE_ASSIGN_OR_RETURN(std::optional<int32_t> unk,
                      token_id_key(gguf, "tokenizer.ggml.unknown_token_id", n));
  spec.bpe.unk_id = unk.value_or(spec.model_vocab->find("<unk>").value_or(-1));

  Normalizer::Replace spaces;
  spaces.literal = " ";
  spaces.content = std::string(kSpaceMarker);
  spec.normalizer.add(std::move(spaces));
  // llama.cpp defaults add_space_prefix to true for SentencePiece vocabularies.
  SE_ASSIGN_OR_RETURN(std::optional<bool> add_space_prefix,
                      optional_key(gguf, "tokenizer.ggml.add_space_prefix",
                                   gguf.find_bool("tokenizer.ggml.add_space_prefix"), "a bool"));
  spec.prepend_space_to_first = add_space_prefix.value_or(true);
  spec.decoder.byte_fallback = true;
  spec.decoder.replacements.emplace_back(std::string(kSpaceMarker), " ");
  spec.decoder.strip_leading_spaces = spec.prepend_space_to_first ? 1 : 0;
  return Status::ok();
}

}  // namespace

Result<GgufPreTokenizer> gguf_pre_tokenizer(std::string_view pre) {
  const std::string gpt2(kGpt2SplitPattern);
  if (one_of(pre, {"default", "gpt2"})) return GgufPreTokenizer{{gpt2}, false};
  if (one_of(pre,
             {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"})) {
    return GgufPreTokenizer{{R"(\p{N})", gpt2}, false};
  }
  if (one_of(pre, {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "dbrx",
                   "smaug-bpe"})) {
    return GgufPreTokenizer{{std::string(kLlama3Split)}, true};
  }
  if (one_of(pre, {"qwen2", "deepseek-r1-qwen", "megrez"})) {
    return GgufPreTokenizer{{std::string(kQwen2Split)}, false};
  }
  if (pre == "qwen35") return GgufPreTokenizer{{std::string(kQwen35Split)}, false};
  return unimplemented("tokenizer.ggml.pre '{}' is not a known pre-tokenizer", pre);
}

Result<TokenizerSpec> tokenizer_spec_from_gguf(const GgufFile& gguf) {
  TokenizerSpec spec;
  spec.source = gguf.path();
  SE_ASSIGN_OR_RETURN(std::string model,
                      required_key(gguf, "tokenizer.ggml.model",
                                   gguf.find_string("tokenizer.ggml.model"), "a string"));
  SE_ASSIGN_OR_RETURN(
      std::vector<std::string> tokens,
      required_key(gguf, "tokenizer.ggml.tokens", gguf.find_string_array("tokenizer.ggml.tokens"),
                   "an array of strings"));
  const size_t n = tokens.size();
  if (n == 0) return invalid_argument("{}: tokenizer.ggml.tokens is empty", gguf.path());
  for (size_t id = 0; id < n; ++id) {
    if (tokens[id].empty() || !utf8::is_valid(tokens[id])) {
      return invalid_argument("{}: tokenizer.ggml.tokens[{}] is empty or not valid UTF-8",
                              gguf.path(), id);
    }
  }
  SE_ASSIGN_OR_RETURN(
      std::optional<std::vector<int32_t>> types_opt,
      optional_key(gguf, "tokenizer.ggml.token_type",
                   gguf.find_i32_array("tokenizer.ggml.token_type"), "an array of int32"));
  std::vector<int32_t> types = types_opt.value_or(std::vector<int32_t>(n, 1));
  if (types.size() < n) {
    return invalid_argument("{}: tokenizer.ggml.token_type has {} entries for {} tokens",
                            gguf.path(), types.size(), n);
  }

  std::vector<bool> respelled(n, false);
  if (model == "gpt2") {
    SE_RETURN_IF_ERROR(fill_byte_level_bpe(gguf, tokens, spec));
  } else if (model == "llama") {
    SE_RETURN_IF_ERROR(fill_sentencepiece_bpe(gguf, tokens, spec, respelled));
  } else {
    return unimplemented("{}: tokenizer.ggml.model '{}' is not supported (only gpt2 and llama)",
                         gguf.path(), model);
  }

  // Control tokens are special; user-defined ones are plain added tokens. Both match whole in raw
  // text, as llama.cpp and transformers' GGUF conversion do.
  for (size_t id = 0; id < n; ++id) {
    if (types[id] != kTypeControl && types[id] != kTypeUserDefined) continue;
    if (respelled[id]) continue;  // transformers finds no token with the original spelling
    AddedToken token;
    token.id = static_cast<int32_t>(id);
    token.content = tokens[id];
    token.special = types[id] == kTypeControl;
    spec.added_tokens.push_back(std::move(token));
  }

  SE_ASSIGN_OR_RETURN(spec.bos_id, token_id_key(gguf, "tokenizer.ggml.bos_token_id", n));
  SE_ASSIGN_OR_RETURN(spec.eos_id, token_id_key(gguf, "tokenizer.ggml.eos_token_id", n));
  for (std::string_view key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    SE_ASSIGN_OR_RETURN(std::optional<int32_t> id, token_id_key(gguf, key, n));
    if (id) spec.extra_eog_ids.push_back(*id);
  }
  SE_ASSIGN_OR_RETURN(std::optional<bool> add_bos,
                      optional_key(gguf, "tokenizer.ggml.add_bos_token",
                                   gguf.find_bool("tokenizer.ggml.add_bos_token"), "a bool"));
  SE_ASSIGN_OR_RETURN(std::optional<bool> add_eos,
                      optional_key(gguf, "tokenizer.ggml.add_eos_token",
                                   gguf.find_bool("tokenizer.ggml.add_eos_token"), "a bool"));
  // llama.cpp adds BOS by default to SentencePiece vocabularies only.
  if (add_bos.value_or(model == "llama")) {
    if (!spec.bos_id) {
      return invalid_argument("{}: add_bos_token is set but tokenizer.ggml.bos_token_id is missing",
                              gguf.path());
    }
    spec.prefix_ids.push_back(*spec.bos_id);
  }
  if (add_eos.value_or(false)) {
    if (!spec.eos_id) {
      return invalid_argument("{}: add_eos_token is set but tokenizer.ggml.eos_token_id is missing",
                              gguf.path());
    }
    spec.suffix_ids.push_back(*spec.eos_id);
  }
  SE_ASSIGN_OR_RETURN(std::optional<std::string> chat_template,
                      optional_key(gguf, "tokenizer.chat_template",
                                   gguf.find_string("tokenizer.chat_template"), "a string"));
  spec.chat_template = chat_template.value_or("");
  return spec;
}

}  // namespace se
