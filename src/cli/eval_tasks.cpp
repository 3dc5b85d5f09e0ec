#include "cli/eval_tasks.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "cli/eval_ruler.h"

namespace se::cli {

namespace {

// The passkey task of Mohtashami & Jaggi (Landmark Attention), as long-context evaluations commonly use it.
constexpr char kInstruction[] =
    "There is an important piece of information hidden inside a lot of irrelevant text. Find it and memorize "
    "it. I will quiz you about the important information there.\n\n";
constexpr char kNeedle[] = " The pass key is {}. Remember it. {} is the pass key.";
constexpr char kPlainQuestion[] = "\n\nWhat is the pass key? The pass key is";
constexpr char kChatQuestion[] = "\n\nWhat is the pass key? Answer with the number only.";
// Stands for the user message while the chat template is rendered around it.
constexpr char kPlaceholder[] = "@@PASSKEY_PROMPT_BODY@@";

void append(std::vector<int32_t>& out, const std::vector<int32_t>& ids) {
  out.insert(out.end(), ids.begin(), ids.end());
}

}  // namespace

Result<PasskeyPrompt> make_passkey_prompt(const ModelBundle& bundle, int32_t num_tokens, double depth, uint64_t seed,
                                          bool chat) {
  if (!bundle.tokenizer) return invalid_argument("passkey: the model has no tokenizer");
  const Tokenizer& tokenizer = *bundle.tokenizer;
  auto encode = [&](const std::string& text) { return tokenizer.encode(text, false, false); };
  std::mt19937_64 rng(seed);
  PasskeyPrompt prompt;
  prompt.passkey = std::to_string(std::uniform_int_distribution<int>(10000, 99999)(rng));

  std::vector<int32_t> head;
  if (!chat && tokenizer.add_bos() && tokenizer.bos_id()) head.push_back(*tokenizer.bos_id());
  append(head, encode(kInstruction));
  const std::vector<int32_t> unit = encode(kNoiseFiller);
  const std::vector<int32_t> needle = encode(fmt::format(kNeedle, prompt.passkey, prompt.passkey));
  const std::vector<int32_t> question = encode(chat ? kChatQuestion : kPlainQuestion);
  const int64_t num_filler =
      static_cast<int64_t>(num_tokens) - static_cast<int64_t>(head.size() + needle.size() + question.size());
  const int64_t unit_len = static_cast<int64_t>(unit.size());
  if (num_filler < unit_len)
    return invalid_argument("passkey: {} tokens are too few for the instruction, the passkey and the question",
                            num_tokens);
  const int64_t num_units = num_filler / unit_len;
  const int64_t units_before = std::clamp<int64_t>(std::llround(depth * static_cast<double>(num_units)), 0, num_units);
  prompt.depth = static_cast<double>(units_before) / static_cast<double>(num_units);

  std::vector<int32_t> body = head;
  for (int64_t i = 0; i < units_before; ++i) append(body, unit);
  append(body, needle);
  // The rest of the filler, cut to the exact length (the last sentence may end early).
  const int64_t num_after = num_filler - units_before * unit_len;
  for (int64_t i = 0; i < num_after; ++i) body.push_back(unit[static_cast<size_t>(i % unit_len)]);
  append(body, question);

  if (!chat) {
    prompt.ids = std::move(body);
    return prompt;
  }
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back({{"role", "user"}, {"content", kPlaceholder}});
  SE_ASSIGN_OR_RETURN(std::string rendered, bundle.render_chat(messages));
  const size_t at = rendered.find(kPlaceholder);
  if (at == std::string::npos) return internal_error("passkey: the chat template dropped the user message");
  prompt.ids = tokenizer.encode(rendered.substr(0, at), /*add_special=*/false, /*parse_special=*/true);
  append(prompt.ids, body);
  append(prompt.ids, tokenizer.encode(rendered.substr(at + std::string_view(kPlaceholder).size()), false, true));
  return prompt;
}

void log_softmax_in_place(std::span<float> logits) {
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x - max));
  const float log_sum = static_cast<float>(std::log(sum)) + max;
  for (float& x : logits) x -= log_sum;
}

StepComparison compare_step(std::span<const float> reference_log_probs, std::span<const float> logits) {
  StepComparison result;
  const auto argmax = [](std::span<const float> v) { return std::max_element(v.begin(), v.end()) - v.begin(); };
  result.top1_agrees = argmax(reference_log_probs) == argmax(logits);
  // The same float log_softmax as the reference's, so identical logits give a KL of exactly 0.
  std::vector<float> log_probs(logits.begin(), logits.end());
  log_softmax_in_place(log_probs);
  double kl = 0.0;
  for (size_t i = 0; i < log_probs.size(); ++i) {
    const double p_log = reference_log_probs[i];
    if (std::isinf(p_log)) continue;  // p = 0 adds nothing
    kl += std::exp(p_log) * (p_log - static_cast<double>(log_probs[i]));
  }
  result.kl = std::max(0.0, kl);
  return result;
}

}  // namespace se::cli
