// GrammarState: where a JsonGrammar's pushdown automaton stands after some bytes of output: a stack of frames,
// one per open value. advance() feeds one byte; a copy is a plain copy of the live frames, cheap enough to make
// at every node of a vocabulary-trie walk. Value type; not shared.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "structured/json_grammar.h"

namespace se {

struct GrammarFrame {
  int32_t node = 0;
  int32_t count = 0;        // object: properties written (the next one's index); array: items; choice: the pick
  uint32_t pos = 0;         // bytes matched of a key, literal, prefix or suffix; hex digits left in \u escapes
  uint8_t phase = 0;        // per node kind (see grammar_state.cpp)
  uint64_t candidates = 0;  // keys, literals or prefixes still matching
};

class GrammarState {
 public:
  // Deeper nesting is refused (the output is then cut at that depth's alternatives).
  static constexpr int kMaxDepth = 32;

  GrammarState() = default;
  explicit GrammarState(const JsonGrammar& grammar);

  // Feeds one byte; false when the grammar does not allow it here (the state is then unspecified).
  bool advance(const JsonGrammar& grammar, uint8_t byte);
  // Whether the output so far is a complete value (it may still go on, e.g. digits of a top-level number).
  bool accepting(const JsonGrammar& grammar) const;
  // No byte may follow: the value is closed.
  bool done() const { return depth_ == 0; }
  // The live frames' contents: equal keys mean equal futures.
  std::string key() const;
  void copy_from(const GrammarState& other);

 private:
  void push(const JsonGrammar& grammar, int32_t node, uint8_t phase = 0);
  GrammarFrame& top() { return frames_[static_cast<size_t>(depth_ - 1)]; }

  int depth_ = 0;
  std::array<GrammarFrame, kMaxDepth> frames_;
};

}  // namespace se
