#include "structured/grammar_state.h"

#include <algorithm>
#include <bit>

namespace se {

namespace {

bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

uint64_t all_of(size_t n) { return n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1; }

// What one number byte does.
enum class Step { kTaken, kRejected, kEnded };

// Number phases: 0 start, 1 after '-', 2 after a leading 0, 3 integer digits, 4 after '.', 5 fraction digits,
// 6 after e/E, 7 after the exponent sign, 8 exponent digits. 2, 3, 5 and 8 may end the number.
Step number_step(GrammarFrame& f, uint8_t c, bool integer) {
  const bool digit = is_digit(c);
  const bool fraction = !integer && c == '.';
  const bool exponent = !integer && (c == 'e' || c == 'E');
  switch (f.phase) {
    case 0:
      if (c == '-') return f.phase = 1, Step::kTaken;
      [[fallthrough]];
    case 1:
      if (c == '0') return f.phase = 2, Step::kTaken;
      if (digit) return f.phase = 3, Step::kTaken;
      return Step::kRejected;
    case 2:
    case 3:
      if (digit && f.phase == 3) return Step::kTaken;
      if (fraction) return f.phase = 4, Step::kTaken;
      if (exponent) return f.phase = 6, Step::kTaken;
      return Step::kEnded;
    case 4:
      return digit ? (f.phase = 5, Step::kTaken) : Step::kRejected;
    case 5:
      if (digit) return Step::kTaken;
      if (exponent) return f.phase = 6, Step::kTaken;
      return Step::kEnded;
    case 6:
      if (c == '+' || c == '-') return f.phase = 7, Step::kTaken;
      return digit ? (f.phase = 8, Step::kTaken) : Step::kRejected;
    case 7:
      return digit ? (f.phase = 8, Step::kTaken) : Step::kRejected;
    default:
      return digit ? Step::kTaken : Step::kEnded;
  }
}

bool number_can_end(uint8_t phase) { return phase == 2 || phase == 3 || phase == 5 || phase == 8; }

// Narrows `f.candidates` to the texts whose byte at f.pos is `c`; false when none is left.
bool narrow(GrammarFrame& f, const std::vector<std::string>& texts, uint8_t c) {
  uint64_t kept = 0;
  for (uint64_t bits = f.candidates; bits != 0; bits &= bits - 1) {
    const int i = std::countr_zero(bits);
    const std::string& t = texts[static_cast<size_t>(i)];
    if (f.pos < t.size() && static_cast<uint8_t>(t[f.pos]) == c) kept |= uint64_t{1} << i;
  }
  if (kept == 0) return false;
  f.candidates = kept;
  ++f.pos;
  return true;
}

// The candidate text fully matched, or -1.
int complete_candidate(const GrammarFrame& f, const std::vector<std::string>& texts) {
  for (uint64_t bits = f.candidates; bits != 0; bits &= bits - 1) {
    const int i = std::countr_zero(bits);
    if (texts[static_cast<size_t>(i)].size() == f.pos) return i;
  }
  return -1;
}

// The properties that may come next in an object after `count` of them: up to and including the first required.
uint64_t next_keys(const GrammarNode& n, int32_t count) {
  uint64_t bits = 0;
  for (size_t i = static_cast<size_t>(count); i < n.keys.size(); ++i) {
    bits |= uint64_t{1} << i;
    if (n.required[i]) break;
  }
  return bits;
}

bool required_left(const GrammarNode& n, int32_t count) {
  return std::find(n.required.begin() + count, n.required.end(), true) != n.required.end();
}

}  // namespace

GrammarState::GrammarState(const JsonGrammar& grammar) { push(grammar, grammar.root()); }

void GrammarState::copy_from(const GrammarState& other) {
  depth_ = other.depth_;
  std::copy_n(other.frames_.begin(), depth_, frames_.begin());
}

std::string GrammarState::key() const {
  std::string out;
  out.reserve(static_cast<size_t>(depth_) * 24);
  auto put = [&out](const auto& v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  for (int i = 0; i < depth_; ++i) {
    const GrammarFrame& f = frames_[static_cast<size_t>(i)];
    put(f.node), put(f.count), put(f.pos), put(f.phase), put(f.candidates);
  }
  return out;
}

void GrammarState::push(const JsonGrammar& grammar, int32_t node, uint8_t phase) {
  GrammarFrame f{.node = node, .phase = phase};
  const GrammarNode& n = grammar.node(node);
  if (n.kind == GrammarNodeKind::kLiterals || n.kind == GrammarNodeKind::kChoice) f.candidates = all_of(n.texts.size());
  frames_[static_cast<size_t>(depth_++)] = f;
}

bool GrammarState::accepting(const JsonGrammar& grammar) const {
  if (depth_ == 0) return true;
  if (depth_ > 1) return false;
  const GrammarFrame& f = frames_[0];
  const GrammarNode& n = grammar.node(f.node);
  if (n.kind == GrammarNodeKind::kNumber || n.kind == GrammarNodeKind::kInteger) return number_can_end(f.phase);
  if (n.kind == GrammarNodeKind::kLiterals) return complete_candidate(f, n.texts) >= 0;
  return false;
}

bool GrammarState::advance(const JsonGrammar& grammar, uint8_t c) {
  // Phases of the container kinds. Schema object: 0 before '{', 1 after '{', 2 in a key, 3 after a value,
  // 4 after ','. Open object: 0, 1 after '{', 2 after a key, 3 after a value, 4 after ','. Array: 0, 1 after '[',
  // 2 after an item, 3 after ','. String: 0, 1 inside, 2 after '\', 3 in \u hex digits, 4 in a UTF-8 sequence.
  // Choice: 0 in the prefixes, 1 in the chosen suffix.
  while (depth_ > 0) {
    if (depth_ > kMaxDepth - 1) return false;
    GrammarFrame& f = top();
    const GrammarNode& n = grammar.node(f.node);
    switch (n.kind) {
      case GrammarNodeKind::kAny:
        --depth_;  // replaced by the kind its first byte names
        if (c == '{')
          push(grammar, JsonGrammar::kOpenObjectNode);
        else if (c == '[')
          push(grammar, JsonGrammar::kOpenArrayNode);
        else if (c == '"')
          push(grammar, JsonGrammar::kStringNode);
        else if (c == '-' || is_digit(c))
          push(grammar, JsonGrammar::kNumberNode);
        else if (c == 't' || c == 'f')
          push(grammar, JsonGrammar::kBooleanNode);
        else if (c == 'n')
          push(grammar, JsonGrammar::kNullNode);
        else
          return false;
        continue;
      case GrammarNodeKind::kString:
        switch (f.phase) {
          case 0:
            return c == '"' ? (f.phase = 1, true) : false;
          case 1:
            if (c == '"') return --depth_, true;
            if (c == '\\') return f.phase = 2, true;
            if (c < 0x20) return false;
            if (c < 0x80) return true;
            if (c >= 0xC2 && c <= 0xDF)
              f.pos = 1;
            else if (c >= 0xE0 && c <= 0xEF)
              f.pos = 2;
            else if (c >= 0xF0 && c <= 0xF4)
              f.pos = 3;
            else
              return false;
            return f.phase = 4, true;
          case 2:
            if (c == 'u') return f.phase = 3, f.pos = 4, true;
            return std::string_view("\"\\/bfnrt").find(static_cast<char>(c)) != std::string_view::npos
                       ? (f.phase = 1, true)
                       : false;
          case 3:
            if (!is_hex(c)) return false;
            if (--f.pos == 0) f.phase = 1;
            return true;
          default:
            if (c < 0x80 || c > 0xBF) return false;
            if (--f.pos == 0) f.phase = 1;
            return true;
        }
      case GrammarNodeKind::kNumber:
      case GrammarNodeKind::kInteger:
        switch (number_step(f, c, n.kind == GrammarNodeKind::kInteger)) {
          case Step::kTaken:
            return true;
          case Step::kRejected:
            return false;
          case Step::kEnded:
            --depth_;  // the byte belongs to what follows the number
            continue;
        }
        return false;
      case GrammarNodeKind::kLiterals: {
        if (narrow(f, n.texts, c)) {
          if (complete_candidate(f, n.texts) >= 0 && std::popcount(f.candidates) == 1) --depth_;
          return true;
        }
        if (complete_candidate(f, n.texts) < 0) return false;
        --depth_;  // a complete literal (a number in an enum) ended by what follows
        continue;
      }
      case GrammarNodeKind::kChoice:
        if (f.phase == 1) {
          const std::string& suffix = n.suffixes[static_cast<size_t>(f.count)];
          if (static_cast<uint8_t>(suffix[f.pos]) != c) return false;
          if (++f.pos == suffix.size()) --depth_;
          return true;
        }
        if (!narrow(f, n.texts, c)) return false;
        if (const int pick = complete_candidate(f, n.texts); pick >= 0) {
          f.phase = 1, f.count = pick, f.pos = 0;
          push(grammar, n.values[static_cast<size_t>(pick)]);
        }
        return true;
      case GrammarNodeKind::kArray:
        switch (f.phase) {
          case 0:
            return c == '[' ? (f.phase = 1, true) : false;
          case 1:
            if (c == ']' && n.min_items == 0) return --depth_, true;
            if (n.max_items == 0) return false;
            break;
          case 2:
            if (c == ',' && (n.max_items < 0 || f.count < n.max_items)) return f.phase = 3, true;
            if (c == ']' && f.count >= n.min_items) return --depth_, true;
            return false;
          default:
            break;
        }
        ++f.count, f.phase = 2;
        push(grammar, n.items);
        continue;
      case GrammarNodeKind::kObject:
        if (n.open) {
          switch (f.phase) {
            case 0:
              return c == '{' ? (f.phase = 1, true) : false;
            case 1:
            case 4:
              if (c == '}' && f.phase == 1) return --depth_, true;
              if (c != '"') return false;
              f.phase = 2;
              push(grammar, JsonGrammar::kStringNode, /*phase=*/1);
              return true;
            case 2:
              if (c != ':') return false;
              f.phase = 3;
              push(grammar, JsonGrammar::kAnyNode);
              return true;
            default:
              if (c == ',') return f.phase = 4, true;
              if (c == '}') return --depth_, true;
              return false;
          }
        }
        switch (f.phase) {
          case 0:
            return c == '{' ? (f.phase = 1, true) : false;
          case 1:
          case 4:
            if (c == '}' && f.phase == 1 && !required_left(n, 0)) return --depth_, true;
            f.candidates = next_keys(n, f.count);
            f.phase = 2, f.pos = 0;
            if (f.candidates == 0 || !narrow(f, n.keys, c)) return false;
            break;
          case 2:
            if (!narrow(f, n.keys, c)) return false;
            break;
          default:
            if (c == ',' && next_keys(n, f.count) != 0) return f.phase = 4, true;
            if (c == '}' && !required_left(n, f.count)) return --depth_, true;
            return false;
        }
        if (const int key = complete_candidate(f, n.keys); key >= 0) {
          f.count = key + 1, f.phase = 3;
          push(grammar, n.values[static_cast<size_t>(key)]);
        }
        return true;
    }
  }
  return false;
}

}  // namespace se
