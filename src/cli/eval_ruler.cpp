#include "cli/eval_ruler.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <random>
#include <set>

#include <fmt/format.h>

namespace se::cli {

namespace {

using Ids = std::vector<int32_t>;

struct TaskInfo {
  RulerTask task;
  std::string_view name;
  int answer_tokens;
};

constexpr std::array<TaskInfo, 6> kTasks = {{
    {RulerTask::kSingleNeedle, "niah_single", 24},
    {RulerTask::kMultiKeyNeedle, "niah_multikey", 24},
    {RulerTask::kMultiValueNeedle, "niah_multivalue", 64},
    {RulerTask::kVariableTracking, "vt", 40},
    {RulerTask::kFrequentWords, "fwe", 32},
    {RulerTask::kQa, "qa", 16},
}};

constexpr char kNeedleHead[] =
    "Some special magic numbers are hidden within the following text. Make sure to memorize it. I will quiz you "
    "about the numbers afterwards.\n";
constexpr char kNeedle[] = " One of the special magic numbers for {} is: {}.";
constexpr char kSingleQuestion[] =
    "\nWhat is the special magic number for {0} mentioned in the provided text? The special magic number for {0} "
    "mentioned in the provided text is";
constexpr char kMultiQuestion[] =
    "\nWhat are all the special magic numbers for {0} mentioned in the provided text? The special magic numbers "
    "for {0} mentioned in the provided text are";
constexpr char kVtHead[] = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n";
constexpr char kVtQuestion[] =
    "\nQuestion: Find all variables that are assigned the value {0} in the text above. Answer: According to the "
    "chain(s) of variable assignment in the text above, {1} variables are assigned the value {0}, they are:";
constexpr char kFweHead[] =
    "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
    "appeared coded words.\n";
constexpr char kFweQuestion[] =
    "\nQuestion: Do not provide any explanation. What are the three most frequently appeared words in the above "
    "coded text? Answer: According to the coded text above, the three most frequently appeared words are:";
constexpr char kQaHead[] = "Answer the question based on the given documents.\n";
constexpr char kQaQuestion[] =
    "\n\nAnswer the question based on the documents above. Question: In which city was {0} born? Answer: {0} was "
    "born in";
constexpr int kNumDistractors = 3;   // multi-key: other keys; multi-value: other values of the same key
constexpr int kChainLength = 5;      // variable tracking: variables bound to the value
constexpr std::array<std::string_view, 12> kJobs = {"baker",   "pilot",  "surgeon", "carpenter", "librarian",
                                                      "painter", "farmer", "lawyer",  "chemist",   "tailor",
                                                      "sailor",  "architect"};

void append(Ids& out, const Ids& ids) { out.insert(out.end(), ids.begin(), ids.end()); }

// Pronounceable made-up words (consonant-vowel syllables), so no answer is guessable from the model's prior.
std::string pseudo_word(std::mt19937_64& rng, int min_syllables, int max_syllables) {
  static constexpr std::string_view kConsonants = "bdfgklmnprstvz";
  static constexpr std::string_view kVowels = "aeiou";
  const int n = std::uniform_int_distribution<int>(min_syllables, max_syllables)(rng);
  std::string word;
  for (int i = 0; i < n; ++i) {
    word += kConsonants[std::uniform_int_distribution<size_t>(0, kConsonants.size() - 1)(rng)];
    word += kVowels[std::uniform_int_distribution<size_t>(0, kVowels.size() - 1)(rng)];
  }
  return word;
}

std::string capitalized(std::string word) {
  word[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(word[0])));
  return word;
}

std::string magic_number(std::mt19937_64& rng) {
  return std::to_string(std::uniform_int_distribution<int>(1000000, 9999999)(rng));
}

// `n` distinct words from `make`, none of them in `taken` (which receives them).
template <typename Make>
std::vector<std::string> distinct(int n, std::set<std::string>& taken, Make&& make) {
  std::vector<std::string> out;
  while (static_cast<int>(out.size()) < n) {
    std::string w = make();
    if (taken.insert(w).second) out.push_back(std::move(w));
  }
  return out;
}

struct Needle {
  Ids ids;
  double depth = 0.0;
};

// head + haystack + question, exactly `num_tokens` tokens: filler units from `next_filler` until the haystack is
// full (the last one cut), with each needle inserted between units at its depth. needles[0] is the one whose
// position the sample reports.
template <typename NextFiller>
Result<RulerSample> assemble(RulerTask task, const Ids& head, std::vector<Needle> needles, const Ids& question,
                             int32_t num_tokens, NextFiller&& next_filler) {
  int64_t num_filler = static_cast<int64_t>(num_tokens) - static_cast<int64_t>(head.size() + question.size());
  for (const Needle& n : needles) num_filler -= static_cast<int64_t>(n.ids.size());
  if (num_filler < 1)
    return invalid_argument("{}: {} tokens are too few for the instruction, the needles and the question",
                            ruler_task_name(task), num_tokens);
  std::vector<Ids> units;
  for (int64_t have = 0; have < num_filler;) {
    Ids unit = next_filler();
    if (have + static_cast<int64_t>(unit.size()) > num_filler) unit.resize(static_cast<size_t>(num_filler - have));
    have += static_cast<int64_t>(unit.size());
    units.push_back(std::move(unit));
  }
  const size_t num_units = units.size();
  std::vector<size_t> at(needles.size());
  for (size_t i = 0; i < needles.size(); ++i)
    at[i] = static_cast<size_t>(std::llround(std::clamp(needles[i].depth, 0.0, 1.0) * static_cast<double>(num_units)));
  std::vector<size_t> order(needles.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return at[a] < at[b]; });

  RulerSample sample;
  sample.task = task;
  sample.ids = head;
  size_t next = 0;
  int64_t filler_before = 0, filler_seen = 0;  // filler tokens before needles[0], and so far
  for (size_t u = 0; u <= num_units; ++u) {
    for (; next < order.size() && at[order[next]] == u; ++next) {
      if (order[next] == 0) {
        sample.needle_token = static_cast<int64_t>(sample.ids.size());
        filler_before = filler_seen;
      }
      append(sample.ids, needles[order[next]].ids);
    }
    if (u < num_units) {
      append(sample.ids, units[u]);
      filler_seen += static_cast<int64_t>(units[u].size());
    }
  }
  append(sample.ids, question);
  sample.needle_ids = needles[0].ids;
  sample.depth = static_cast<double>(filler_before) / static_cast<double>(num_filler);
  return sample;
}

Result<RulerSample> make_needles(RulerTask task, const EncodeFn& encode, const Ids& head, int32_t num_tokens,
                                 double depth, std::mt19937_64& rng) {
  std::set<std::string> taken;
  const std::string key = distinct(1, taken, [&] { return pseudo_word(rng, 2, 3); })[0];
  std::vector<std::string> answers = {magic_number(rng)};
  std::vector<Needle> needles = {{encode(fmt::format(kNeedle, key, answers[0])), depth}};
  std::uniform_real_distribution<double> anywhere(0.0, 1.0);
  if (task == RulerTask::kMultiKeyNeedle) {
    for (const std::string& other : distinct(kNumDistractors, taken, [&] { return pseudo_word(rng, 2, 3); }))
      needles.push_back({encode(fmt::format(kNeedle, other, magic_number(rng))), anywhere(rng)});
  } else if (task == RulerTask::kMultiValueNeedle) {
    std::set<std::string> values = {answers[0]};
    for (const std::string& value : distinct(kNumDistractors, values, [&] { return magic_number(rng); })) {
      answers.push_back(value);
      needles.push_back({encode(fmt::format(kNeedle, key, value)), anywhere(rng)});
    }
  }
  const Ids question =
      encode(fmt::format(fmt::runtime(task == RulerTask::kMultiValueNeedle ? kMultiQuestion : kSingleQuestion), key));
  const Ids filler = encode(kNoiseFiller);
  SE_ASSIGN_OR_RETURN(RulerSample sample,
                      assemble(task, head, std::move(needles), question, num_tokens, [&] { return filler; }));
  sample.answers = std::move(answers);
  return sample;
}

Result<RulerSample> make_variable_tracking(const EncodeFn& encode, const Ids& head, int32_t num_tokens, double depth,
                                           std::mt19937_64& rng) {
  std::set<std::string> taken;
  std::vector<std::string> names = distinct(kChainLength, taken, [&] {
    std::string name;
    for (int i = 0; i < 5; ++i) name += static_cast<char>('A' + std::uniform_int_distribution<int>(0, 25)(rng));
    return name;
  });
  const std::string value = std::to_string(std::uniform_int_distribution<int>(10000, 99999)(rng));
  // The chain's links spread evenly from `depth` to the end of the haystack, in order.
  std::vector<Needle> needles;
  for (int i = 0; i < kChainLength; ++i) {
    const std::string rhs = i == 0 ? value : "VAR " + names[static_cast<size_t>(i - 1)];
    needles.push_back({encode(fmt::format(" VAR {} = {}.", names[static_cast<size_t>(i)], rhs)),
                       depth + (1.0 - depth) * i / kChainLength});
  }
  const Ids question = encode(fmt::format(kVtQuestion, value, kChainLength));
  const Ids filler = encode(kNoiseFiller);
  SE_ASSIGN_OR_RETURN(RulerSample sample, assemble(RulerTask::kVariableTracking, head, std::move(needles), question,
                                                   num_tokens, [&] { return filler; }));
  sample.answers = std::move(names);
  return sample;
}

Result<RulerSample> make_frequent_words(const EncodeFn& encode, const Ids& head, int32_t num_tokens,
                                        std::mt19937_64& rng) {
  const Ids question = encode(kFweQuestion);
  const int64_t budget = static_cast<int64_t>(num_tokens) - static_cast<int64_t>(head.size() + question.size());
  // About ten tokens' worth of words per distractor, so each distractor occurs a handful of times.
  const int num_vocab = static_cast<int>(std::clamp<int64_t>(budget / 30, 20, 4000));
  std::set<std::string> taken;
  const std::vector<std::string> words = distinct(num_vocab + 3, taken, [&] { return pseudo_word(rng, 2, 3); });
  std::vector<Ids> word_ids;
  size_t min_len = SIZE_MAX;
  for (const std::string& w : words) {
    word_ids.push_back(encode(" " + w));
    min_len = std::min(min_len, word_ids.back().size());
  }
  // A distractor occurs at most ceil(budget / (min_len * num_vocab)) times; the top three occur more, by steps
  // of two so their order is unambiguous too.
  const int64_t cap = (budget + static_cast<int64_t>(min_len) * num_vocab - 1) / (static_cast<int64_t>(min_len) * num_vocab);
  std::vector<size_t> list;
  int64_t used = 0;
  for (size_t top = 0; top < 3; ++top)
    for (int64_t i = 0; i < cap + 2 * (3 - static_cast<int64_t>(top)); ++i) {
      list.push_back(top);
      used += static_cast<int64_t>(word_ids[top].size());
    }
  if (used > budget)
    return invalid_argument("fwe: {} tokens are too few for the instruction, the words and the question", num_tokens);
  for (size_t i = 0;; ++i) {
    const size_t w = 3 + i % static_cast<size_t>(num_vocab);
    if (used + static_cast<int64_t>(word_ids[w].size()) > budget) break;
    used += static_cast<int64_t>(word_ids[w].size());
    list.push_back(w);
  }
  std::shuffle(list.begin(), list.end(), rng);
  RulerSample sample;
  sample.task = RulerTask::kFrequentWords;
  sample.ids = head;
  for (size_t w : list) append(sample.ids, word_ids[w]);
  append(sample.ids, question);
  sample.answers = {words[0], words[1], words[2]};
  return sample;
}

Result<RulerSample> make_qa(const EncodeFn& encode, const Ids& head, int32_t num_tokens, double depth,
                            std::mt19937_64& rng) {
  std::set<std::string> names;
  auto person = [&] { return capitalized(pseudo_word(rng, 2, 3)) + " " + capitalized(pseudo_word(rng, 2, 4)); };
  auto document = [&](const std::string& name, const std::string& city) {
    const std::string_view job = kJobs[std::uniform_int_distribution<size_t>(0, kJobs.size() - 1)(rng)];
    const int year = std::uniform_int_distribution<int>(1900, 2000)(rng);
    return encode(fmt::format(
        "\n\nDocument: {0} was born in {1} in {2}. {0} worked as a {3} in {4} and later moved to {5}, where "
        "{0} lived on {6} Street.",
        name, city, year, job, capitalized(pseudo_word(rng, 2, 3)), capitalized(pseudo_word(rng, 2, 3)),
        capitalized(pseudo_word(rng, 2, 3))));
  };
  const std::string name = distinct(1, names, person)[0];
  const std::string city = capitalized(pseudo_word(rng, 3, 4));
  const Ids question = encode(fmt::format(kQaQuestion, name));
  SE_ASSIGN_OR_RETURN(RulerSample sample,
                      assemble(RulerTask::kQa, head, {{document(name, city), depth}}, question, num_tokens, [&] {
                        return document(distinct(1, names, person)[0], capitalized(pseudo_word(rng, 3, 4)));
                      }));
  sample.answers = {city};
  return sample;
}

bool is_word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }

}  // namespace

std::string_view ruler_task_name(RulerTask task) {
  for (const TaskInfo& info : kTasks)
    if (info.task == task) return info.name;
  return "unknown";
}

Result<RulerTask> parse_ruler_task(std::string_view name) {
  for (const TaskInfo& info : kTasks)
    if (info.name == name) return info.task;
  return invalid_argument("unknown task '{}' (niah_single, niah_multikey, niah_multivalue, vt, fwe, qa)", name);
}

std::vector<RulerTask> all_ruler_tasks() {
  std::vector<RulerTask> out;
  for (const TaskInfo& info : kTasks) out.push_back(info.task);
  return out;
}

int ruler_answer_tokens(RulerTask task) {
  for (const TaskInfo& info : kTasks)
    if (info.task == task) return info.answer_tokens;
  return 0;
}

Result<RulerSample> make_ruler_sample(RulerTask task, const EncodeFn& encode, std::optional<int32_t> bos,
                                      int32_t num_tokens, double depth, uint64_t seed) {
  if (!(depth >= 0.0 && depth <= 1.0)) return invalid_argument("{}: depth {} is not in [0, 1]", ruler_task_name(task), depth);
  std::mt19937_64 rng(seed);
  Ids head;
  if (bos) head.push_back(*bos);
  switch (task) {
    case RulerTask::kSingleNeedle:
    case RulerTask::kMultiKeyNeedle:
    case RulerTask::kMultiValueNeedle:
      append(head, encode(kNeedleHead));
      return make_needles(task, encode, head, num_tokens, depth, rng);
    case RulerTask::kVariableTracking:
      append(head, encode(kVtHead));
      return make_variable_tracking(encode, head, num_tokens, depth, rng);
    case RulerTask::kFrequentWords:
      append(head, encode(kFweHead));
      return make_frequent_words(encode, head, num_tokens, rng);
    case RulerTask::kQa:
      append(head, encode(kQaHead));
      return make_qa(encode, head, num_tokens, depth, rng);
  }
  return invalid_argument("unknown task");
}

bool contains_word(std::string_view text, std::string_view word) {
  if (word.empty()) return false;
  auto lower = [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); };
  for (size_t at = 0; at + word.size() <= text.size(); ++at) {
    bool match = true;
    for (size_t i = 0; i < word.size() && match; ++i) match = lower(text[at + i]) == lower(word[i]);
    if (!match) continue;
    const bool left = at == 0 || !is_word_char(text[at - 1]);
    const bool right = at + word.size() == text.size() || !is_word_char(text[at + word.size()]);
    if (left && right) return true;
  }
  return false;
}

bool ruler_correct(const RulerSample& sample, std::string_view output) {
  return std::all_of(sample.answers.begin(), sample.answers.end(),
                     [&](const std::string& a) { return contains_word(output, a); });
}

}  // namespace se::cli
