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
  // Sets the logits of refused tokens to -inf. logits: [vocab] (may be longer than the tokenizer's vocabulary;
  // ids past it are refused). When nothing is allowed (a dead end the vocabulary cannot leave), only
  // end-of-generation is.
  void mask_logits(std::span<float> logits);
  // Moves past a sampled token; false when the grammar refuses it (the matcher is then unchanged).
  bool accept(int32_t token_id);
  bool is_allowed(int32_t token_id);

 private:
  std::vector<uint64_t> compute_allowed();

  std::shared_ptr<const TokenGrammar> grammar_;
  GrammarState state_;
  std::vector<GrammarState> walk_;  // scratch: one state per trie depth
  std::string key_;                 // the state the cached mask below belongs to
  const std::vector<uint64_t>* mask_ = nullptr;
  std::unordered_map<std::string, std::vector<uint64_t>> masks_;  // by GrammarState::key()
};

}  // namespace se
