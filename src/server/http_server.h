// HttpServer: the OpenAI-compatible HTTP front of one Engine (cpp-httplib). One thread accepts connections,
// a pool of worker threads serves them: POST /v1/completions, POST /v1/chat/completions, GET /v1/models,
// GET /health, GET /metrics. The engine must outlive the server. start(), begin_drain(), wait_idle() and stop()
// are meant for one controlling thread (the serve command); the handlers run on the workers.
#pragma once

#include <chrono>
#include <memory>
#include <thread>

#include "engine/engine.h"
#include "server/server_context.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace se::server {

class HttpServer {
 public:
  // Binds host:port (kUnavailable naming them when that fails) and starts serving in the background.
  static Result<std::unique_ptr<HttpServer>> start(Engine& engine, const ServerConfig& config);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The bound port (the chosen one when config.port was 0).
  int port() const { return port_; }
  // New generation requests and /health answer 503 from now on; requests in flight continue.
  void begin_drain();
  // True once no generation request is in flight; false when `timeout` passed first.
  bool wait_idle(std::chrono::milliseconds timeout);
  // Closes the listening socket and joins the HTTP threads; streams still open are cut (and so aborted).
  void stop();

 private:
  HttpServer(Engine& engine, const ServerConfig& config);
  void add_routes();

  std::unique_ptr<ServerContext> ctx_;
  std::unique_ptr<httplib::Server> http_;
  std::thread listener_;
  int port_ = 0;
};

}  // namespace se::server
