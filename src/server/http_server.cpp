#include "server/http_server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <ctime>
#include <exception>

#include "base/logging.h"
#include "server/api_key.h"
#include "server/generation_route.h"
#include "server/openai_response.h"
#include "server/prometheus.h"
#include "server/prefix_cache_route.h"
#include "server/prefix_prune_route.h"
#include "server/tokenize_route.h"

namespace se::server {

namespace {

constexpr size_t kKeepAliveMaxRequests = 1000;

int resolve_max_model_len(const Engine& engine) {
  const int configured = engine.config().max_model_len;
  return configured > 0 ? configured : engine.bundle().model->config().max_position_embeddings;
}

// Errors httplib raises itself (no route, body too large, unparsable request) get the OpenAI shape too.
ApiError http_error(int status) {
  switch (status) {
    case 404: return ApiError{404, "no such route", ""};
    case 405: return ApiError{405, "method not allowed on this route", ""};
    case 413: return ApiError{413, "the request body is too large", ""};
    default: return ApiError{status, fmt::format("HTTP error {}", status), ""};
  }
}

}  // namespace

HttpServer::HttpServer(Engine& engine, const ServerConfig& config)
    : ctx_(std::make_unique<ServerContext>(engine, config, resolve_max_model_len(engine),
                                           static_cast<int64_t>(std::time(nullptr)))),
      http_(std::make_unique<httplib::Server>()) {}

Result<std::unique_ptr<HttpServer>> HttpServer::start(Engine& engine, const ServerConfig& config) {
  if (config.num_threads < 1)
    return invalid_argument("the HTTP server needs at least 1 thread, got {}", config.num_threads);
  std::unique_ptr<HttpServer> server(new HttpServer(engine, config));
  httplib::Server& http = *server->http_;
  const size_t num_threads = static_cast<size_t>(config.num_threads);
  http.new_task_queue = [num_threads] { return new httplib::ThreadPool(num_threads); };
  http.set_payload_max_length(config.max_body_bytes);
  http.set_keep_alive_max_count(kKeepAliveMaxRequests);
  http.set_tcp_nodelay(true);  // SSE chunks are small; do not let Nagle hold them back
  server->add_routes();
  if (config.port == 0) {
    server->port_ = http.bind_to_any_port(config.host);
    if (server->port_ < 0) return unavailable("cannot bind {} on any port", config.host);
  } else {
    if (!http.bind_to_port(config.host, config.port))
      return unavailable("cannot bind {}:{} (in use, or not a local address?)", config.host, config.port);
    server->port_ = config.port;
  }
  server->listener_ = std::thread([&http] { http.listen_after_bind(); });
  return server;
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::begin_drain() { ctx_->draining = true; }

bool HttpServer::wait_idle(std::chrono::milliseconds timeout) { return ctx_->inflight.wait_idle(timeout); }

void HttpServer::stop() {
  if (http_) http_->stop();
  if (listener_.joinable()) listener_.join();
}

void HttpServer::add_routes() {
  ServerContext& ctx = *ctx_;
  httplib::Server& http = *http_;
  // With an API key, everything but /health (the load balancer's probe) needs it; checked before routing, so
  // an unknown route does not tell a caller without the key which routes exist.
  http.set_pre_routing_handler([&ctx](const httplib::Request& req, httplib::Response& res) {
    if (ctx.config.api_key.empty() || req.path == "/health" ||
        api_key_matches(ctx.config.api_key, req.get_header_value("Authorization")))
      return httplib::Server::HandlerResponse::Unhandled;
    res.set_header("WWW-Authenticate", "Bearer");
    send_error(res, ApiError{401, "Incorrect API key provided: send it as 'Authorization: Bearer <key>'", ""});
    return httplib::Server::HandlerResponse::Handled;
  });
  http.Post("/v1/completions", [&ctx](const httplib::Request& req, httplib::Response& res) {
    handle_generation(ctx, Endpoint::kCompletions, req, res);
  });
  http.Post("/v1/chat/completions", [&ctx](const httplib::Request& req, httplib::Response& res) {
    handle_generation(ctx, Endpoint::kChatCompletions, req, res);
  });
  for (const char* path : {"/v1/completions", "/v1/chat/completions"})
    http.Get(path, [](const httplib::Request&, httplib::Response& res) { send_error(res, http_error(405)); });

  http.Post("/v1/prefix_cache/inspect", [&ctx](const httplib::Request& req, httplib::Response& res) {
    handle_prefix_cache_inspect(ctx, req, res);
  });
  http.Post("/v1/prefix_cache/match", [&ctx](const httplib::Request& req, httplib::Response& res) {
    handle_prefix_cache_match(ctx, req, res);
  });
  http.Post("/tokenize", [&ctx](const httplib::Request& req, httplib::Response& res) {
    handle_tokenize(ctx, req, res);
  });
  http.Post("/v1/prefix_cache/prune", [&ctx](const httplib::Request& req, httplib::Response& res) {
    handle_prefix_cache_prune(ctx, req, res);
  });
  http.Get(R"(/v1/prefix_cache/prune/([^/]+))", [&ctx](const httplib::Request& req, httplib::Response& res) {
    handle_prefix_cache_prune_status(ctx, req.matches[1].str(), res);
  });

  http.Get("/v1/models", [&ctx](const httplib::Request&, httplib::Response& res) {
    const ModelBundle& bundle = ctx.engine.bundle();
    nlohmann::json model = {{"id", bundle.name},     {"object", "model"},         {"created", ctx.created},
                            {"owned_by", "sparse-engine"}, {"root", bundle.path}, {"parent", nullptr},
                            {"max_model_len", ctx.max_model_len}};
    res.set_content(dump_json({{"object", "list"}, {"data", nlohmann::json::array({model})}}), "application/json");
  });
  http.Get("/health", [&ctx](const httplib::Request&, httplib::Response& res) {
    res.status = ctx.draining ? 503 : 200;
  });
  http.Get("/metrics", [&ctx](const httplib::Request&, httplib::Response& res) {
    res.set_content(render_prometheus(ctx.engine.stats(), ctx.engine.bundle().name),
                    std::string(kPrometheusContentType));
  });

  // httplib calls this for every status >= 400, ours included: fill in only the bodies it left empty.
  http.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        res.set_content(http_error(res.status).body(), "application/json");
        return httplib::Server::HandlerResponse::Handled;
      }));
  http.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    SE_LOG_ERROR("{} {}: {}", req.method, req.path, what);
    send_error(res, ApiError{500, "internal error: " + what, ""});
  });
}

}  // namespace se::server
