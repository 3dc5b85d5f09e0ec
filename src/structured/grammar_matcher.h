// TokenGrammar and GrammarMatcher: constrained decoding over a model's vocabulary. A TokenGrammar (a JsonGrammar,
// the model's VocabTrie and its end-of-generation ids) is immutable and shared by the requests that use it; each
// request's GrammarMatcher (owned by its sampler, engine thread only) tracks the output so far and answers which
// tokens may come next: those whose bytes the grammar accepts from here, plus end-of-generation once the value
// is complete. The allowed set is found by walking the trie against the automaton, skipping refused subtrees,
// and is remembered per automaton state, since outputs revisit states (inside a string, between properties).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "structured/grammar_state.h"
#include "structured/json_grammar.h"
#include "structured/vocab_trie.h"

namespace se {

struct TokenGrammar {
  JsonGrammar grammar;
  std::shared_ptr<const VocabTrie> vocab;
  std::vector<int32_t> eog_ids;  // allowed once the value is complete, and only then
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const TokenGrammar> grammar);

  // The tokens allowed next: bit i of word i / 64 (vocab_size bits).
  const std::vector<uint64_t>& allowed_tokens();
  // The tokens that may be sampled next, as bits (token i: bit i % 64 of words[i / 64]) over words.size() * 64
  // ids, which may outnumber the tokenizer's vocabulary (ids past it are refused): allowed_tokens(), or, at a
  // dead end the vocabulary cannot leave, end-of-generation only.
  void write_next_tokens(std::span<uint64_t> words);
  // Sets the logits of the tokens write_next_tokens refuses to -inf. logits: [vocab or more].
  void mask_logits(std::span<float> logits);
  // Moves past a sampled token; false when the grammar refuses it (the matcher is then unchanged).
  bool accept(int32_t token_id);
  bool is_allowed(int32_t token_id);

 private:
  std::vector<uint64_t> compute_allowed();

  std::shared_ptr<const TokenGrammar> grammar_;
  GrammarState state_;
  std::vector<GrammarState> walk_;     // scratch: one state per trie depth
  std::vector<uint64_t> next_tokens_;  // scratch of mask_logits
  std::string key_;                    // the state the cached mask below belongs to
  const std::vector<uint64_t>* mask_ = nullptr;
  std::unordered_map<std::string, std::vector<uint64_t>> masks_;  // by GrammarState::key()
};

}  // namespace se
