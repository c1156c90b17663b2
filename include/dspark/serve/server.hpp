// dspark/serve/server.hpp — the OpenAI-compatible HTTP front end of
// `dspark serve` (cpp-httplib).
//
// Endpoints:
//   GET  /health               {"status": "loading" | "ready" | "full" | "shutting down", active, queued, ...}
//                              (200 only when "ready")
//   GET  /metrics              Prometheus text (metrics.hpp)
//   GET  /v1/models            the served model
//   POST /v1/completions       prompt → text       (api.hpp for the fields)
//   POST /v1/chat/completions  messages → message  (the model's chat template)
//   POST /tokenize, /detokenize  llama.cpp's token endpoints
// Both generation endpoints stream server-sent events when "stream" is true:
// `data: <chunk>\n\n` per piece of text, a final chunk with finish_reason,
// usage and the "dspark" figures, then `data: [DONE]\n\n`.
//
// With API keys (ServerOptions::api_keys) every /v1/* route and the token
// endpoints need `Authorization: Bearer <key>` (else 401 with an OpenAI
// error body); /health and /metrics stay open. Model routes answer 503 with
// Retry-After while the model loads, beyond the engine's wait queue
// (EngineOptions::max_queue), for a request whose deadline passed before it
// got a slot, and while the server drains.
//
// Every HTTP connection runs on its own worker thread, which queues the
// request on the Engine and waits on the request's channel. A streaming
// client that goes away is noticed at the next write and its request is
// cancelled, freeing its slot. Bad requests get HTTP 400 with an OpenAI error
// body; an exception never escapes a handler.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "dspark/model/loaded_model.hpp"
#include "dspark/serve/auth.hpp"
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
  int parallel = 8;                 // the engine's slots (sizes the worker pool)
  int http_threads = 0;             // worker threads kept ready; 0 = 4 × parallel + 16
  int http_max_threads = 1024;      // most worker threads: one per open connection, started on demand
  ApiKeys api_keys;                 // empty: no authentication
  /// Deadline of requests that set no "deadline_ms"; 0: none.
  std::chrono::milliseconds default_deadline{0};
};

class Server {
 public:
  /// Sets SIGPIPE to be ignored (a client that closes its connection must
  /// not end the process). Until attach(), /health says "loading" and the
  /// model routes answer 503.
  explicit Server(ServerOptions opts);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Binds the listening socket; returns the port (the chosen one when the
  /// options say 0). Throws Error when the address cannot be bound.
  int bind();
  /// Serves until stop(), or until drain() and the end of the last open
  /// connection; requires bind(). Callable on another thread than attach().
  void listen();
  /// Serves `model` with `engine` from now on; both must outlive the server
  /// and the engine must decode with model.target. Throws InvalidArgument
  /// when the context asked for exceeds the model's.
  void attach(const LoadedModel& model, Engine& engine);
  /// Graceful shutdown, first half: the listening socket closes (no new
  /// connections), /health says "shutting down" (503), requests arriving on
  /// open connections get 503 with Connection: close, and requests in
  /// flight go on (streams included). listen() returns once their
  /// connections have closed; cancel what must not finish with
  /// Engine::shutdown(). Idempotent.
  void drain();
  /// Stops at once: connections and streams are cut. Callable from any
  /// thread, any number of times; after drain() it leaves the draining
  /// connections alone.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dspark::serve
