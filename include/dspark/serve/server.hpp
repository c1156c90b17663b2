// dspark/serve/server.hpp — the OpenAI-compatible HTTP front end of
// `dspark serve` (cpp-httplib).
//
// Endpoints:
//   GET  /health               {"status": "ok", active, queued, parallel, ...}
//   GET  /v1/models            the served model
//   POST /v1/completions       prompt → text       (api.hpp for the fields)
//   POST /v1/chat/completions  messages → message  (the model's chat template)
// Both POST endpoints stream server-sent events when "stream" is true:
// `data: <chunk>\n\n` per piece of text, a final chunk with finish_reason,
// usage and the "dspark" figures, then `data: [DONE]\n\n`.
//
// Every HTTP connection runs on its own worker thread, which queues the
// request on the Engine and waits on the request's channel. A streaming
// client that goes away is noticed at the next write and its request is
// cancelled, freeing its slot. Bad requests get HTTP 400 with an OpenAI error
// body; an exception never escapes a handler.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dspark/model/loaded_model.hpp"
#include "dspark/serve/engine.hpp"
#include "dspark/speculative/sampling.hpp"

namespace dspark::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                  // 0: any free port (see bind())
  std::string model_name = "dspark";  // "model" in responses and /v1/models
  int64_t ctx_size = 0;             // context per request; 0 = the model's
  int64_t default_max_tokens = 256; // for requests without max_tokens (capped by the context)
  SamplingParams defaults;          // for sampling fields a request omits
  int http_threads = 0;             // worker threads; 0 = 4 × parallel + 16
};

class Server {
 public:
  /// `model` and `engine` must outlive the server; the engine must decode
  /// with model.target. Sets SIGPIPE to be ignored (a client that closes its
  /// connection must not end the process).
  Server(const LoadedModel& model, Engine& engine, ServerOptions opts);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Binds the listening socket; returns the port (the chosen one when the
  /// options say 0). Throws Error when the address cannot be bound.
  int bind();
  /// Serves until stop(); requires bind(). Returns once the listening loop
  /// and every connection have ended.
  void listen();
  /// Stops accepting connections and makes listen() return. Callable from
  /// any thread, any number of times.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dspark::serve
