// The prompt of a chat turn that continues a chain append-only (the request's chain_append_start): the chain's
// stored tokens (its last turn's prompt and generated reply, exactly as they were computed) followed by the
// tokens of what the chat template renders after that reply: the reply's closing and the new messages, with
// the generation prompt. The reply is never re-rendered or re-tokenized, so a reply whose text would tokenize
// differently still extends the chain. Pure; thread-safe.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

#include "engine/model_bundle.h"
#include "server/api_error.h"

namespace se::server {

// `messages[append_start - 1]` must be the assistant reply that ended the chain's last turn and `chain_tokens`
// that turn's tokens (Engine::chain_prefix). 400 when the message before append_start is not an assistant reply
// with text, or the template does not render that reply verbatim (what follows it is then unknown).
ApiResult<std::vector<int32_t>> chain_append_prompt(const ModelBundle& bundle, const nlohmann::json& messages,
                                                    int append_start, const std::vector<int32_t>& chain_tokens,
                                                    const ChatExtras& extras);

}  // namespace se::server
