// `sparse-engine serve`: loads the model, starts the Engine and the HTTP server, and runs until SIGINT/SIGTERM.
// Shutdown: stop admitting (new requests and /health answer 503), let in-flight requests finish for up to
// --drain-timeout seconds, abort the rest, then close the listening socket; exit 0.
#include "cli/serve_command.h"

#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <memory>
#include <string>

#include "cli/engine_options.h"
#include "cli/model_options.h"
#include "engine/engine.h"
#include "server/http_server.h"
#include "server/reasoning_parser.h"

namespace se::cli {

namespace {

// After the drain, aborted requests still get their closing events written; this bounds that wait.
constexpr std::chrono::seconds kAbortFlushTimeout{5};

struct ServeOptions {
  ModelOptions model;
  std::string chat_template_path;
  std::string reasoning_parser;
  std::string tool_call_parser;
  EngineConfig engine;
  server::ServerConfig server;
  std::string served_model_name;
  double drain_timeout_s = 30.0;
};

// A --chat-template file: the Jinja text replaces the model's own template.
Result<ChatTemplate> load_chat_template(const std::string& path) {
  std::ifstream file(path);
  if (!file) return not_found("--chat-template: cannot read '{}'", path);
  std::stringstream text;
  text << file.rdbuf();
  Result<ChatTemplate> parsed = ChatTemplate::parse(text.str());
  if (!parsed.is_ok()) return parsed.status().with_context(path);
  return parsed;
}

const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "signal"; }

int run_serve(const ServeOptions& o) {
  // Block the shutdown signals before any thread exists (engine, OpenMP, HTTP workers inherit the mask); this
  // thread takes them synchronously with sigwait, so no handler runs in the middle of a step.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (Status sparse = check_sparse_options(o.engine); !sparse.is_ok()) return report_usage_error(sparse);
  auto bundle = o.model.load(o.engine.device, o.engine.tensor_parallel_size);
  if (!bundle.is_ok()) return report_error(bundle.status());
  if (!o.served_model_name.empty()) bundle->name = o.served_model_name;
  if (!o.chat_template_path.empty()) {
    Result<ChatTemplate> chat_template = load_chat_template(o.chat_template_path);
    if (!chat_template.is_ok()) return report_error(chat_template.status());
    bundle->chat_template = std::move(chat_template).value();
  }
  server::ServerConfig server_config = o.server;
  // The names were checked as the flags were read.
  if (!o.reasoning_parser.empty())
    server_config.reasoning_format = server::reasoning_format_from_name(o.reasoning_parser);
  if (!o.tool_call_parser.empty())
    server_config.tool_call_format = server::tool_call_format_from_name(o.tool_call_parser);
  auto engine = Engine::create(*bundle, o.engine);
  if (!engine.is_ok()) return report_error(engine.status());
  auto http = server::HttpServer::start(**engine, server_config);
  if (!http.is_ok()) {
    (*engine)->shutdown(/*drain=*/false);
    return report_error(http.status());
  }
  std::fprintf(stderr, "serving '%s' (max model len %d, sparse method %s) on http://%s:%d\n", bundle->name.c_str(),
               (*engine)->config().max_model_len, o.engine.sparse_method.c_str(), o.server.host.c_str(),
               (*http)->port());

  int sig = 0;
  sigwait(&signals, &sig);
  std::fprintf(stderr, "%s: draining requests in flight (up to %.0f s)\n", signal_name(sig), o.drain_timeout_s);
  (*http)->begin_drain();
  const auto drain_timeout = std::chrono::milliseconds(static_cast<int64_t>(o.drain_timeout_s * 1000.0));
  if (!(*http)->wait_idle(drain_timeout)) std::fprintf(stderr, "drain timed out: aborting what is left\n");
  (*engine)->shutdown(/*drain=*/false);
  (*http)->wait_idle(kAbortFlushTimeout);
  (*http)->stop();
  std::fprintf(stderr, "server stopped\n");
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)");
  o->model.add_to(*cmd);
  cmd->add_option("--host", o->server.host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", o->server.port, "port to listen on (0 = any free port)")->capture_default_str();
  cmd->add_option("--served-model-name", o->served_model_name,
                  "the model name clients send and /v1/models lists (default: the model's name)");
  add_engine_options(*cmd, o->engine);
  cmd->add_option("--max-n", o->server.max_n, "choices per request (n) at most")->capture_default_str();
  cmd->add_option("--http-threads", o->server.num_threads, "HTTP worker threads (one per streaming client)")
      ->capture_default_str();
  cmd->add_option("--api-key", o->server.api_key,
                  "clients must send 'Authorization: Bearer <key>' on every route but /health (401 otherwise)")
      ->envname("SPARSE_ENGINE_API_KEY");
  cmd->add_option("--max-waiting-requests", o->server.max_waiting_requests,
                  "generation requests answer 503 with Retry-After while this many wait (0 = no limit)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--chat-template", o->chat_template_path,
                  "a Jinja chat template file that replaces the model's own (e.g. one that renders tools)");
  cmd->add_option("--reasoning-parser", o->reasoning_parser,
                  "split <think> reasoning into reasoning_content (vLLM's parser names)")
      ->check(CLI::IsMember(server::reasoning_parser_names()));
  cmd->add_option("--tool-call-parser", o->tool_call_parser,
                  "parse tool calls from chat output (and allow tools with tool_choice auto/required/named): hermes "
                  "or llama3_json")
      ->check(CLI::IsMember({"hermes", "llama3_json"}));
  cmd->add_option("--drain-timeout", o->drain_timeout_s, "seconds to let requests finish on SIGINT/SIGTERM")
      ->capture_default_str();
  cmd->callback([o, &exit_code] { exit_code = run_serve(*o); });
}

}  // namespace se::cli
