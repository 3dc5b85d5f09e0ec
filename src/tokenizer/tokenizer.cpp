#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <unordered_map>

#include "tokenizer/byte_level.h"
#include "tokenizer/gguf_vocab.h"
#include "tokenizer/tokenizer_json.h"
#include "tokenizer/tokenizer_spec.h"
#include "tokenizer/utf8.h"

namespace se {

struct TokenizerState {
  std::string source;
  std::shared_ptr<const Vocab> model_vocab;
  BpeModel bpe;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  bool prepend_space_to_first = false;
  AddedTokenMatcher raw_matcher;         // added tokens matched in the input as written
  AddedTokenMatcher normalized_matcher;  // added tokens matched after normalization
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> added_ids;

  std::vector<std::string> spellings;  // per id, added-token content overriding the model's
  std::vector<std::string> pieces;     // per id, the bytes it decodes to
  std::vector<bool> valid;
  std::vector<bool> special;
  std::vector<int32_t> prefix_ids;
  std::vector<int32_t> suffix_ids;
  std::optional<int32_t> bos_id;
  std::optional<int32_t> eos_id;
  std::string bos_token;
  std::string eos_token;
  std::vector<int32_t> eog_ids;
  int strip_leading_spaces = 0;
  std::string chat_template;

  explicit TokenizerState(BpeModel model) : bpe(std::move(model)) {}
};

namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581

// Token texts llama.cpp treats as end of generation (when they are control tokens).
constexpr std::string_view kEogTexts[] = {"<|eot_id|>",      "<|eom_id|>",    "<|im_end|>",
                                          "<|end|>",         "<end_of_turn>", "<|endoftext|>",
                                          "<|end_of_text|>", "<EOT>"};

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string decode_piece(const std::string& spelling, const DecoderSpec& decoder) {
  if (decoder.byte_fallback && spelling.size() == 6 && spelling.starts_with("<0x") &&
      spelling.back() == '>' && hex_digit(spelling[3]) >= 0 && hex_digit(spelling[4]) >= 0) {
    return std::string(1, static_cast<char>(hex_digit(spelling[3]) * 16 + hex_digit(spelling[4])));
  }
  std::string text = spelling;
  for (const auto& [from, to] : decoder.replacements) replace_all(text, from, to);
  if (!decoder.byte_level) return text;
  std::string bytes;
  byte_level::decode_append(text, bytes);
  return bytes;
}

}  // namespace

Result<Tokenizer> Tokenizer::from_gguf(const GgufFile& gguf) {
  SE_ASSIGN_OR_RETURN(TokenizerSpec spec, tokenizer_spec_from_gguf(gguf));
  return from_spec(std::move(spec));
}

Result<Tokenizer> Tokenizer::from_hf_files(const std::string& tokenizer_json_path,
                                           const std::string& tokenizer_config_json_path) {
  SE_ASSIGN_OR_RETURN(TokenizerSpec spec, tokenizer_spec_from_hf_files(tokenizer_json_path,
                                                                       tokenizer_config_json_path));
  return from_spec(std::move(spec));
}

Result<Tokenizer> Tokenizer::from_spec(TokenizerSpec spec) {
  const Vocab& vocab = *spec.model_vocab;
  std::shared_ptr<const Vocab> model_vocab = spec.model_vocab;
  Result<BpeModel> bpe =
      spec.merge_priority.empty()
          ? BpeModel::from_merges(model_vocab, spec.merges, spec.bpe)
          : BpeModel::from_priorities(model_vocab, std::move(spec.merge_priority), spec.bpe);
  if (!bpe.is_ok()) return bpe.status().with_context(spec.source);
  auto state = std::make_shared<TokenizerState>(std::move(bpe).value());
  state->source = spec.source;
  state->model_vocab = model_vocab;
  state->normalizer = std::move(spec.normalizer);
  state->pre_tokenizer = std::move(spec.pre_tokenizer);
  state->prepend_space_to_first = spec.prepend_space_to_first;
  state->strip_leading_spaces = spec.decoder.strip_leading_spaces;
  state->chat_template = std::move(spec.chat_template);

  int32_t size = vocab.size();
  for (const AddedToken& t : spec.added_tokens) {
    if (t.id < 0)
      return invalid_argument("{}: added token '{}' has a negative id", spec.source, t.content);
    if (t.content.empty())
      return invalid_argument("{}: added token {} is empty", spec.source, t.id);
    size = std::max(size, t.id + 1);
  }
  state->spellings.resize(size);
  state->valid.assign(size, false);
  state->special.assign(size, false);
  for (int32_t id = 0; id < vocab.size(); ++id) {
    if (!vocab.contains(id)) continue;
    state->spellings[id] = vocab.spelling(id);
    state->valid[id] = true;
  }
  // What each id decodes from: its spelling, or for an added token matched after normalization
  // its normalized content (as HF decodes it).
  std::vector<std::string> decode_sources = state->spellings;
  std::vector<AddedToken> raw_tokens;
  std::vector<std::string> raw_patterns;
  std::vector<AddedToken> normalized_tokens;
  std::vector<std::string> normalized_patterns;
  for (const AddedToken& t : spec.added_tokens) {
    state->spellings[t.id] = t.content;
    decode_sources[t.id] = t.content;
    state->valid[t.id] = true;
    state->special[t.id] = t.special;
    state->added_ids.insert_or_assign(t.content, t.id);
    if (t.normalized) {
      decode_sources[t.id] = state->normalizer.apply(t.content);
      normalized_tokens.push_back(t);
      normalized_patterns.push_back(decode_sources[t.id]);
    } else {
      raw_tokens.push_back(t);
      raw_patterns.push_back(t.content);
    }
  }
  state->raw_matcher = AddedTokenMatcher(std::move(raw_tokens), std::move(raw_patterns));
  state->normalized_matcher =
      AddedTokenMatcher(std::move(normalized_tokens), std::move(normalized_patterns));

  state->pieces.resize(size);
  for (int32_t id = 0; id < size; ++id) {
    if (state->valid[id]) state->pieces[id] = decode_piece(decode_sources[id], spec.decoder);
  }

  auto check_id = [&](int32_t id, std::string_view what) -> Status {
    if (id < 0 || id >= size || !state->valid[id]) {
      return invalid_argument("{}: {} id {} is not in the vocabulary (size {})", spec.source, what,
                              id, size);
    }
    return Status::ok();
  };
  for (int32_t id : spec.prefix_ids) SE_RETURN_IF_ERROR(check_id(id, "prefix token"));
  for (int32_t id : spec.suffix_ids) SE_RETURN_IF_ERROR(check_id(id, "suffix token"));
  state->prefix_ids = std::move(spec.prefix_ids);
  state->suffix_ids = std::move(spec.suffix_ids);
  if (spec.bos_id) {
    SE_RETURN_IF_ERROR(check_id(*spec.bos_id, "BOS"));
    state->bos_id = spec.bos_id;
    state->bos_token = state->spellings[*spec.bos_id];
  }
  if (spec.eos_id) {
    SE_RETURN_IF_ERROR(check_id(*spec.eos_id, "EOS"));
    state->eos_id = spec.eos_id;
    state->eos_token = state->spellings[*spec.eos_id];
    state->eog_ids.push_back(*spec.eos_id);
  }
  for (int32_t id : spec.extra_eog_ids) {
    SE_RETURN_IF_ERROR(check_id(id, "end-of-turn token"));
    state->eog_ids.push_back(id);
  }
  for (std::string_view text : kEogTexts) {
    auto it = state->added_ids.find(text);
    if (it != state->added_ids.end() && state->special[it->second])
      state->eog_ids.push_back(it->second);
  }
  std::sort(state->eog_ids.begin(), state->eog_ids.end());
  state->eog_ids.erase(std::unique(state->eog_ids.begin(), state->eog_ids.end()),
                       state->eog_ids.end());
  return Tokenizer(std::move(state));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  const TokenizerState& s = *state_;
  const std::string input = utf8::sanitize(text);
  std::vector<int32_t> ids;
  if (add_special) ids = s.prefix_ids;

  std::vector<AddedTokenMatcher::Segment> segments;
  s.raw_matcher.split(input, parse_special, segments);
  std::vector<AddedTokenMatcher::Segment> inner;
  std::vector<std::string> pieces;
  for (const auto& segment : segments) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    std::string normalized = s.normalizer.apply(
        std::string_view(input).substr(segment.begin, segment.end - segment.begin));
    if (s.prepend_space_to_first && segment.begin == 0 && !normalized.empty() &&
        !normalized.starts_with(kSpaceMarker)) {
      normalized.insert(0, kSpaceMarker);
    }
    inner.clear();
    s.normalized_matcher.split(normalized, parse_special, inner);
    for (const auto& part : inner) {
      if (part.id >= 0) {
        ids.push_back(part.id);
        continue;
      }
      pieces.clear();
      s.pre_tokenizer.split(std::string_view(normalized).substr(part.begin, part.end - part.begin),
                            pieces);
      for (const std::string& piece : pieces) s.bpe.encode(piece, ids);
    }
  }
  if (add_special) ids.insert(ids.end(), s.suffix_ids.begin(), s.suffix_ids.end());
  return ids;
}

Result<std::string> Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const TokenizerState& s = *state_;
  std::string bytes;
  for (int32_t id : ids) {
    if (!is_valid_id(id)) {
      return out_of_range("{}: token id {} is outside the vocabulary (size {})", s.source, id,
                          vocab_size());
    }
    if (skip_special && s.special[id]) continue;
    bytes += s.pieces[id];
  }
  size_t skip = 0;
  while (skip < bytes.size() && skip < static_cast<size_t>(s.strip_leading_spaces) &&
         bytes[skip] == ' ') {
    ++skip;
  }
  std::string text;
  text.reserve(bytes.size() - skip);
  utf8::append_lossy(std::string_view(bytes).substr(skip), /*final=*/true, text);
  return text;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(state_->valid.size()); }

bool Tokenizer::is_valid_id(int32_t id) const {
  return id >= 0 && id < vocab_size() && state_->valid[id];
}

std::string_view Tokenizer::token_text(int32_t id) const {
  return is_valid_id(id) ? std::string_view(state_->spellings[id]) : std::string_view();
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  return is_valid_id(id) ? std::string_view(state_->pieces[id]) : std::string_view();
}

std::optional<int32_t> Tokenizer::token_id(std::string_view text) const {
  auto it = state_->added_ids.find(text);
  if (it != state_->added_ids.end()) return it->second;
  return state_->model_vocab->find(text);
}

std::optional<int32_t> Tokenizer::bos_id() const { return state_->bos_id; }
std::optional<int32_t> Tokenizer::eos_id() const { return state_->eos_id; }
const std::string& Tokenizer::bos_token() const { return state_->bos_token; }
const std::string& Tokenizer::eos_token() const { return state_->eos_token; }

bool Tokenizer::add_bos() const {
  return state_->bos_id && std::find(state_->prefix_ids.begin(), state_->prefix_ids.end(),
                                     *state_->bos_id) != state_->prefix_ids.end();
}

bool Tokenizer::add_eos() const {
  return state_->eos_id && std::find(state_->suffix_ids.begin(), state_->suffix_ids.end(),
                                     *state_->eos_id) != state_->suffix_ids.end();
}

const std::vector<int32_t>& Tokenizer::eog_ids() const { return state_->eog_ids; }

bool Tokenizer::is_eog(int32_t id) const {
  return std::binary_search(state_->eog_ids.begin(), state_->eog_ids.end(), id);
}

bool Tokenizer::is_special(int32_t id) const { return is_valid_id(id) && state_->special[id]; }

int Tokenizer::leading_spaces_to_strip() const { return state_->strip_leading_spaces; }

const std::string& Tokenizer::chat_template() const { return state_->chat_template; }

}  // namespace se
