// The OpenAI-compatible HTTP front end; see include/dspark/serve/server.hpp.
//
// The only translation unit that includes httplib.h (a heavy header). The
// Debian package ships cpp-httplib as a compiled library built with OpenSSL,
// zlib and brotli support; this file must see the same CPPHTTPLIB_* macros
// (pkg-config cpp-httplib --cflags) or the library's structs would not match.
// DSPARK_HAVE_HTTPLIB is defined by the build when that library is linked.
#include "dspark/serve/server.hpp"

#include <csignal>

#include "dspark/error.hpp"

#ifndef DSPARK_HAVE_HTTPLIB

namespace dspark::serve {

struct Server::Impl {};

Server::Server(const LoadedModel&, Engine&, ServerOptions) {
  throw Error("this dspark was built without cpp-httplib (libcpp-httplib-dev): serve is unavailable");
}
Server::~Server() = default;
int Server::bind() { return -1; }
void Server::listen() {}
void Server::stop() {}

}  // namespace dspark::serve

#else  // DSPARK_HAVE_HTTPLIB

#if !defined(CPPHTTPLIB_OPENSSL_SUPPORT) || !defined(CPPHTTPLIB_ZLIB_SUPPORT)
#error "compile with the flags of `pkg-config --cflags cpp-httplib` (they must match the library)"
#endif

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>

#include "dspark/serve/api.hpp"
#include "dspark/serve/request_checks.hpp"
#include "peer_socket.hpp"

namespace dspark::serve {

namespace {

using nlohmann::json;
using Clock = std::chrono::system_clock;

constexpr const char* kJson = "application/json";
// Exactly this type: httplib leaves text/event-stream uncompressed, so every
// chunk reaches the client as soon as it is written.
constexpr const char* kEventStream = "text/event-stream";
// How long a streaming response waits for text before writing an SSE comment
// (which also detects a client that went away while its request was queued).
constexpr std::chrono::milliseconds kKeepAlive{2000};
constexpr size_t kMaxBody = size_t{64} << 20;  // bytes of one request body
// How often a non-streaming request checks that its client is still there.
constexpr std::chrono::milliseconds kClientCheck{200};

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), kJson);
}

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& type,
                const std::string& param = {}) {
  send_json(res, status, error_body(message, type, param));
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(Clock::now().time_since_epoch()).count();
}

// What a streaming response keeps between calls of its content provider.
struct StreamState {
  std::shared_ptr<Request> req;
  ResponseMeta meta;
  bool include_usage = false;
  bool started = false;
};

}  // namespace

struct Server::Impl {
  const LoadedModel& model;
  Engine& engine;
  ServerOptions opts;
  int64_t ctx = 0;
  int64_t started = unix_now();
  httplib::Server http;
  std::atomic<bool> stopping{false};
  std::mutex rng_mu;
  std::mt19937_64 rng{std::random_device{}()};

  Impl(const LoadedModel& m, Engine& e, ServerOptions o) : model(m), engine(e), opts(std::move(o)) {
    ctx = opts.ctx_size > 0 ? opts.ctx_size : m.target->info().context;
    m.target->new_cache(ctx);  // refuses a context beyond the model's before serving
    const int threads = opts.http_threads > 0 ? opts.http_threads : 4 * engine.load().parallel + 16;
    http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
    http.set_keep_alive_timeout(2);
    http.set_tcp_nodelay(true);
    http.set_payload_max_length(kMaxBody);
    routes();
  }

  uint64_t random() {
    std::lock_guard lk(rng_mu);
    return rng();
  }

  std::string new_id(const char* prefix) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%016llx%08llx", static_cast<unsigned long long>(random()),
                  static_cast<unsigned long long>(random() & 0xffffffffu));
    return std::string(prefix) + buf;
  }

  void routes() {
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) { health(res); });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) { models(res); });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      generate(req, res, Endpoint::Completions);
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      generate(req, res, Endpoint::ChatCompletions);
    });
    // A POST's body framing is checked before the HTTP library reads the
    // body: without this, a missing or unreadable Content-Length makes it
    // wait for the read timeout (5 s) before refusing the request.
    http.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
      if (req.method != "POST" || req.has_header("Transfer-Encoding"))
        return httplib::Server::HandlerResponse::Unhandled;
      const std::string length = req.get_header_value("Content-Length");
      int status = 0;
      std::string message;
      if (length.empty()) {
        status = 411;
        message = "a POST needs a Content-Length header (the size of its JSON body in bytes)";
      } else if (malformed_content_length(length)) {
        status = 400;
        message = "Content-Length: expected a non-negative integer, got '" + length + "'";
      } else if (length.size() > 9 || std::stoull(length) > kMaxBody) {
        status = 413;
        message = "request body too large: Content-Length " + length + ", the limit is 64 MiB";
      }
      if (status == 0) return httplib::Server::HandlerResponse::Unhandled;
      res.set_header("Connection", "close");  // the unread body must not be read as a request
      send_error(res, status, message, "invalid_request_error");
      return httplib::Server::HandlerResponse::Handled;
    });
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;  // a handler already wrote an error body
      // A known path asked with another method: 405 with the allowed one.
      static constexpr std::pair<const char*, const char*> kRoutes[] = {
          {"/health", "GET"}, {"/v1/models", "GET"}, {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"}};
      if (res.status == 404 || res.status == 400) {
        for (const auto& [path, method] : kRoutes) {
          if (req.path != path || req.method == method) continue;
          res.set_header("Allow", method);
          send_error(res, 405, req.path + " expects " + method + ", got " + req.method, "invalid_request_error");
          return;
        }
      }
      const int status = res.status;
      std::string message = "request failed with HTTP status " + std::to_string(status);
      // The HTTP library reads a negative or non-numeric Content-Length as a
      // huge one and answers 413; the request is malformed, not too large.
      const std::string length = req.get_header_value("Content-Length");
      if (status == 413 && malformed_content_length(length)) {
        send_error(res, 400, "Content-Length: expected a non-negative integer, got '" + length + "'",
                   "invalid_request_error");
        return;
      }
      if (status == 404) {
        message = "no such endpoint: " + req.method + " " + req.path;
      } else if (status == 400) {
        // The HTTP library refused the request before any handler ran.
        message = "malformed HTTP request (a POST needs a JSON body and a Content-Length header)";
      } else if (status == 413) {
        // The HTTP library caps form-encoded bodies (curl -d's default type) at 8 KiB.
        const std::string type = req.get_header_value("Content-Type");
        message = type.rfind("application/x-www-form-urlencoded", 0) == 0
                      ? "request body too large for Content-Type " + type +
                            " (8 KiB at most); send JSON with 'Content-Type: application/json' (up to 64 MiB)"
                      : "request body too large: the limit is 64 MiB";
      }
      send_error(res, status, message, "invalid_request_error");
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      send_error(res, 500, "internal error: " + what, "server_error");
    });
  }

  void health(httplib::Response& res) {
    const EngineLoad l = engine.load();
    send_json(res, stopping ? 503 : 200,
              {{"status", stopping ? "shutting down" : "ok"},
               {"model", opts.model_name},
               {"speculative", engine.drafter() != nullptr},
               {"active", l.active},
               {"queued", l.queued},
               {"parallel", l.parallel},
               {"steps", l.steps},
               {"completed", l.completed}});
  }

  void models(httplib::Response& res) {
    send_json(res, 200,
              {{"object", "list"},
               {"data", json::array({{{"id", opts.model_name},
                                      {"object", "model"},
                                      {"created", started},
                                      {"owned_by", "dspark"},
                                      {"context_length", ctx}}})}});
  }

  // Prompt ids of a validated request. Throws RequestError.
  std::vector<TokenId> prompt_ids(const ApiRequest& ar) const {
    if (ar.endpoint == Endpoint::Completions) return model.encode_prompt(ar.prompt, false);
    if (!model.chat)
      throw RequestError("the model declares no supported chat template; use /v1/completions", "messages");
    try {
      return model.chat->apply(ar.messages, true);
    } catch (const InvalidArgument& e) {
      throw RequestError(e.what(), "messages");
    }
  }

  void generate(const httplib::Request& req, httplib::Response& res, Endpoint ep) {
    try {
      if (stopping) return send_error(res, 503, "the server is shutting down", "server_error");
      const ApiRequest ar = parse_request(req.body, ep, opts.defaults);
      const char* prompt_param = ep == Endpoint::Completions ? "prompt" : "messages";
      std::vector<TokenId> prompt = prompt_ids(ar);
      const int64_t n_prompt = static_cast<int64_t>(prompt.size());
      try {
        check_prompt_length(n_prompt, ctx, prompt_param);
      } catch (const InvalidArgument& e) {
        throw RequestError(e.what(), prompt_param);
      }
      try {
        if (ar.max_tokens) check_max_tokens(*ar.max_tokens, n_prompt, ctx, "max_tokens");
      } catch (const InvalidArgument& e) {
        throw RequestError(e.what(), "max_tokens");
      }
      GenerateOptions g;
      g.n_predict = ar.max_tokens.value_or(std::min(opts.default_max_tokens, ctx - n_prompt));
      g.ctx_size = ctx;
      g.sampling = ar.sampling;
      // A request that names a seed gets seed-stable text: the same whatever
      // else the server is decoding (sampling.hpp, SamplingRule).
      if (ar.seed_given) g.sampling.rule = SamplingRule::SeedStable;
      else g.sampling.seed = random();
      g.stop_ids = model.stop_ids;

      std::shared_ptr<Request> request;
      try {
        request = engine.submit(std::move(prompt), std::move(g), ar.stop);
      } catch (const InvalidArgument& e) {
        throw RequestError(e.what());
      } catch (const Error& e) {
        return send_error(res, 503, e.what(), "server_error");
      }
      ResponseMeta meta{ep, new_id(ep == Endpoint::Completions ? "cmpl-" : "chatcmpl-"), unix_now(),
                        opts.model_name};
      if (ar.stream) return stream(res, std::move(request), std::move(meta), ar.include_usage);

      const std::string text = wait_watching_client(req, *request);
      const RequestOutcome& o = request->outcome();
      switch (o.reason) {
        case FinishReason::Stop:
        case FinishReason::Length:
          return send_json(res, 200, response_json(meta, text, o));
        case FinishReason::Cancelled:
          return send_error(res, 503, o.error, "server_error");
        case FinishReason::Error:
          return send_error(res, 500, "generation failed: " + o.error, "server_error");
      }
    } catch (const RequestError& e) {
      send_error(res, 400, e.what(), "invalid_request_error", e.param());
    } catch (const std::exception& e) {
      send_error(res, 500, std::string("internal error: ") + e.what(), "server_error");
    }
  }

  // Waits for a non-streaming request to end; cancels it when its client
  // closes the connection meanwhile (the slot is freed at the next step).
  static std::string wait_watching_client(const httplib::Request& http_req, Request& request) {
    const int fd = find_connection_socket(http_req.local_addr, http_req.local_port, http_req.remote_addr,
                                          http_req.remote_port);
    std::string text;
    while (!request.poll(text, kClientCheck))
      if (fd >= 0 && !request.cancel_requested() && peer_closed(fd)) request.cancel();
    return text;
  }

  void stream(httplib::Response& res, std::shared_ptr<Request> request, ResponseMeta meta,
              bool include_usage) {
    auto st = std::make_shared<StreamState>();
    st->req = std::move(request);
    st->meta = std::move(meta);
    st->include_usage = include_usage;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        kEventStream,
        [st](size_t, httplib::DataSink& sink) {
          // Called repeatedly until done(); each call writes something, so a
          // client that has gone away is noticed by a failed write.
          std::string out;
          if (!st->started) {
            st->started = true;
            if (st->meta.endpoint == Endpoint::ChatCompletions) out += sse_event(role_chunk_json(st->meta));
          }
          std::string text;
          const bool ended = st->req->poll(text, out.empty() ? kKeepAlive : std::chrono::milliseconds(0));
          if (!text.empty()) out += sse_event(chunk_json(st->meta, text));
          if (ended) {
            const RequestOutcome& o = st->req->outcome();
            if (o.reason == FinishReason::Stop || o.reason == FinishReason::Length) {
              out += sse_event(final_chunk_json(st->meta, o));
              if (st->include_usage) out += sse_event(usage_chunk_json(st->meta, o));
            } else {
              out += sse_event(error_body(o.reason == FinishReason::Error ? "generation failed: " + o.error
                                                                            : o.error,
                                          "server_error"));
            }
            out += "data: [DONE]\n\n";
          }
          if (out.empty()) out = ": keep-alive\n\n";
          if (!sink.write(out.data(), out.size())) {
            st->req->cancel();
            return false;
          }
          if (ended) sink.done();
          return true;
        },
        // Runs when the response is destroyed, however the stream ended;
        // a no-op for a request that already ended.
        [st](bool) { st->req->cancel(); });
  }
};

Server::Server(const LoadedModel& model, Engine& engine, ServerOptions opts) {
  std::signal(SIGPIPE, SIG_IGN);
  impl_ = std::make_unique<Impl>(model, engine, std::move(opts));
}

Server::~Server() { stop(); }

int Server::bind() {
  Impl& s = *impl_;
  // httplib's default options add SO_REUSEPORT, which lets a second server
  // bind a port that is already serving and share its connections; keep only
  // SO_REUSEADDR (rebinding right after a restart) so a taken port is an error.
  s.http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  if (s.opts.port == 0) {
    const int port = s.http.bind_to_any_port(s.opts.host);
    if (port < 0) throw Error("cannot listen on " + s.opts.host + " (any port)");
    return port;
  }
  if (!s.http.bind_to_port(s.opts.host, s.opts.port))
    throw Error("cannot listen on " + s.opts.host + ":" + std::to_string(s.opts.port) +
                " (address in use or not available)");
  return s.opts.port;
}

void Server::listen() { impl_->http.listen_after_bind(); }

void Server::stop() {
  impl_->stopping = true;
  impl_->http.stop();
}

}  // namespace dspark::serve

#endif  // DSPARK_HAVE_HTTPLIB
