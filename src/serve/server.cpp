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

Server::Server(ServerOptions) {
  throw Error("this dspark was built without cpp-httplib (libcpp-httplib-dev): serve is unavailable");
}
Server::~Server() = default;
int Server::bind() { return -1; }
void Server::listen() {}
void Server::attach(const LoadedModel&, Engine&) {}
void Server::drain() {}
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
#include <cmath>
#include <mutex>
#include <random>
#include <sys/socket.h>

#include "dspark/serve/api.hpp"
#include "dspark/serve/metrics.hpp"
#include "dspark/serve/request_checks.hpp"
#include "http_pool.hpp"
#include "peer_socket.hpp"
#include "sse_stream.hpp"

namespace dspark::serve {

namespace {

using nlohmann::json;
using Clock = std::chrono::system_clock;

constexpr const char* kJson = "application/json";
// Exactly this type: httplib leaves text/event-stream uncompressed, so every
// chunk reaches the client as soon as it is written.
constexpr const char* kEventStream = "text/event-stream";
constexpr size_t kMaxBody = size_t{64} << 20;  // bytes of one request body
// How often a non-streaming request checks that its client is still there.
constexpr std::chrono::milliseconds kClientCheck{200};
// The route label of /metrics: the known paths, "other" for the rest.
std::string route_label(const std::string& path) {
  static const char* kKnown[] = {"/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions",
                                 "/tokenize", "/detokenize"};
  for (const char* k : kKnown)
    if (path == k) return k;
  return "other";
}

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

}  // namespace

struct Server::Impl {
  ServerOptions opts;
  // Set once by attach(), before `ready`; handlers read them after seeing it.
  const LoadedModel* model_ptr = nullptr;
  Engine* engine_ptr = nullptr;
  std::atomic<bool> ready{false};
  int64_t ctx = 0;
  int64_t started = unix_now();
  httplib::Server http;
  std::atomic<bool> stopping{false};
  std::atomic<int> listen_fd{-1};  // the listening socket (drain() shuts it down)
  std::mutex rng_mu;
  std::mt19937_64 rng{std::random_device{}()};
  RequestCounts requests;

  explicit Impl(ServerOptions o) : opts(std::move(o)) {
    const int threads = opts.http_threads > 0 ? opts.http_threads : 4 * opts.parallel + 16;
    const int most = std::max(threads, opts.http_max_threads);
    http.new_task_queue = [threads, most] {
      return new ElasticPool(static_cast<size_t>(threads), static_cast<size_t>(most));
    };
    http.set_keep_alive_timeout(2);
    http.set_tcp_nodelay(true);
    http.set_payload_max_length(kMaxBody);
    routes();
  }

  const LoadedModel& model() const { return *model_ptr; }
  Engine& engine() const { return *engine_ptr; }

  // Seconds a client turned away for load should wait: the time the
  // requests ahead of it take on the free slots, from the mean request time
  // so far (1 s before any has finished), between 1 and 60.
  int retry_after() const {
    if (!ready) return 5;
    const EngineLoad l = engine().load();
    const EngineMetrics m = engine().metrics();
    const int64_t done = m.time_to_first_token.count();
    const double mean = done > 0 ? (m.time_to_first_token.sum() + m.time_per_output_token.sum()) / done : 1.0;
    const double wait = mean * (l.waiting() + 1) / std::max(1, l.parallel);
    return static_cast<int>(std::clamp(std::ceil(wait), 1.0, 60.0));
  }

  void send_unavailable(httplib::Response& res, const std::string& message, int retry) {
    res.set_header("Retry-After", std::to_string(retry));
    send_error(res, 503, message, "server_error");
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
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) { metrics(res); });
    http.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      if (admitted(req, res)) models(res);
    });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      if (admitted(req, res)) generate(req, res, Endpoint::Completions);
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      if (admitted(req, res)) generate(req, res, Endpoint::ChatCompletions);
    });
    http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
      if (admitted(req, res)) tokenize(req, res);
    });
    http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
      if (admitted(req, res)) detokenize(req, res);
    });
    // Counts every answered request for /metrics, once its response is written.
    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      requests.add(route_label(req.path), res.status);
    });
    http.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) { return framing(req, res); });
    error_handlers();
  }

  // Whether a model route may serve `req`; otherwise answers it: 401 without
  // a valid API key, 503 while the model loads or the server drains. Checked
  // once the body is read (answering before it would leave the body to be
  // read as the next request on the connection).
  bool admitted(const httplib::Request& req, httplib::Response& res) {
    if (!opts.api_keys.allows(req.get_header_value("Authorization"))) {
      res.set_header("WWW-Authenticate", "Bearer");
      send_json(res, 401,
                {{"error",
                  {{"message", req.has_header("Authorization")
                                   ? "Incorrect API key provided (send 'Authorization: Bearer <key>')."
                                   : "No API key provided: send 'Authorization: Bearer <key>'."},
                   {"type", "invalid_request_error"},
                   {"param", nullptr},
                   {"code", "invalid_api_key"}}}});
      return false;
    }
    if (!ready || stopping) {
      res.set_header("Connection", "close");
      send_unavailable(res, stopping ? "the server is shutting down" : "the model is loading", stopping ? 1 : 5);
      return false;
    }
    return true;
  }

  // A POST's body framing, checked before the HTTP library reads the body:
  // without this, a missing or unreadable Content-Length makes it wait for
  // the read timeout (5 s) before refusing the request.
  static httplib::Server::HandlerResponse framing(const httplib::Request& req, httplib::Response& res) {
    if (req.method != "POST") return httplib::Server::HandlerResponse::Unhandled;
    const std::string length = req.get_header_value("Content-Length");
    int status = 0;
    std::string message;
    if (req.has_header("Transfer-Encoding")) {
      // Both framings at once is how requests are smuggled past proxies
      // (RFC 9112 §6.1): refused, with the connection closed.
      if (req.has_header("Content-Length")) {
        status = 400;
        message = "a request must not carry both Transfer-Encoding and Content-Length";
      }
    } else if (length.empty()) {
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
  }

  void error_handlers() {
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;  // a handler already wrote an error body
      // A known path asked with another method: 405 with the allowed one.
      static constexpr std::pair<const char*, const char*> kRoutes[] = {
          {"/health", "GET"},         {"/v1/models", "GET"},   {"/v1/completions", "POST"},
          {"/v1/chat/completions", "POST"}, {"/tokenize", "POST"}, {"/detokenize", "POST"}};
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
      } else if (status == 400 && !req.method.empty() && req.has_header("Content-Length") &&
                 !req.has_header("Transfer-Encoding")) {
        // Headers read, body not: the client sent less than it announced.
        message = "malformed HTTP request: its body ended, or stopped arriving for the read timeout, before the " +
                  length + " bytes its Content-Length announced";
      } else if (status == 400) {
        // The HTTP library refused the request before any handler ran.
        message =
            "malformed HTTP request: its request line or headers could not be read (too long, or not HTTP/1.x), "
            "or a POST came without a Content-Length header";
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

  // GET /health: "loading" (503) until the model is attached, "ready" (200)
  // while a request would be taken, "full" (503, Retry-After) while the wait
  // queue is at --max-queue, "shutting down" (503) once drain() began.
  void health(httplib::Response& res) {
    if (!ready) {
      res.set_header("Retry-After", "5");
      return send_json(res, 503, {{"status", stopping ? "shutting down" : "loading"}, {"model", opts.model_name}});
    }
    const EngineLoad l = engine().load();
    const char* status = stopping ? "shutting down" : l.full() ? "full" : "ready";
    if (!stopping && l.full()) res.set_header("Retry-After", std::to_string(retry_after()));
    send_json(res, stopping || l.full() ? 503 : 200,
              {{"status", status},
               {"model", opts.model_name},
               {"speculative", engine().speculative()},
               {"active", l.active},
               {"queued", l.queued},
               {"parallel", l.parallel},
               {"max_queue", l.max_queue},
               {"steps", l.steps},
               {"completed", l.completed}});
  }

  // GET /metrics: Prometheus text (metrics.hpp).
  void metrics(httplib::Response& res) {
    EngineMetrics m;
    ServerGauges g;
    bool speculative = false;
    if (ready) {
      m = engine().metrics();
      const EngineLoad l = engine().load();
      g = {l.active, l.queued, l.parallel, l.max_queue};
      speculative = engine().speculative();
    }
    res.status = 200;
    res.set_content(prometheus_text(opts.model_name, speculative, m, g, requests.snapshot()),
                    "text/plain; version=0.0.4; charset=utf-8");
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

  // POST /tokenize {"content": text, "add_special": false} → {"tokens": [...]}
  // (llama.cpp's server): the ids a completions prompt of that text gets with
  // add_special (BOS as `generate -p` adds it), or the text's own ids.
  void tokenize(const httplib::Request& req, httplib::Response& res) {
    try {
      const json j = parse_object(req.body);
      const auto content = j.find("content");
      if (content == j.end() || !content->is_string())
        throw RequestError("'content' must be a string", "content");
      const auto special = j.find("add_special");
      if (special != j.end() && !special->is_boolean()) throw RequestError("'add_special' must be a boolean", "add_special");
      const std::string text = content->get<std::string>();
      const bool add = special != j.end() && special->get<bool>();
      send_json(res, 200, {{"tokens", add ? model().encode_prompt(text, false) : model().tokenizer->encode(text, true)}});
    } catch (const RequestError& e) {
      send_error(res, 400, e.what(), "invalid_request_error", e.param());
    }
  }

  // POST /detokenize {"tokens": [...]} → {"content": text} (llama.cpp's server).
  void detokenize(const httplib::Request& req, httplib::Response& res) {
    try {
      const json j = parse_object(req.body);
      const auto tokens = j.find("tokens");
      if (tokens == j.end() || !tokens->is_array()) throw RequestError("'tokens' must be an array of token ids", "tokens");
      std::vector<TokenId> ids;
      const int64_t vocab = model().target->info().vocab;
      for (const json& t : *tokens) {
        if (!(t.is_number_integer() || t.is_number_unsigned()) || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
          throw RequestError("'tokens': expected token ids in [0, " + std::to_string(vocab) + "), got " + t.dump(), "tokens");
        ids.push_back(static_cast<TokenId>(t.get<int64_t>()));
      }
      send_json(res, 200, {{"content", model().tokenizer->decode(ids)}});
    } catch (const RequestError& e) {
      send_error(res, 400, e.what(), "invalid_request_error", e.param());
    }
  }

  static json parse_object(const std::string& body) {
    json j = json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw RequestError("the request body must be a JSON object");
    return j;
  }

  // Token ids of one completions prompt: text pieces tokenized (the first
  // piece with BOS, as `generate -p` does), ids as given. Throws RequestError.
  std::vector<TokenId> completion_ids(const PromptInput& prompt) const {
    std::vector<TokenId> ids;
    const int64_t vocab = model().target->info().vocab;
    for (size_t i = 0; i < prompt.size(); ++i) {
      const PromptPiece& piece = prompt[i];
      if (piece.is_text) {
        const auto t = i == 0 ? model().encode_prompt(piece.text, false) : model().tokenizer->encode(piece.text, true);
        ids.insert(ids.end(), t.begin(), t.end());
        continue;
      }
      for (TokenId id : piece.ids)
        if (id >= vocab)
          throw RequestError("'prompt': token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                 std::to_string(vocab) + ")",
                             "prompt");
      ids.insert(ids.end(), piece.ids.begin(), piece.ids.end());
    }
    return ids;
  }

  // Prompt ids of a validated request, one per choice. Throws RequestError.
  std::vector<std::vector<TokenId>> prompt_ids(const ApiRequest& ar) const {
    std::vector<std::vector<TokenId>> out;
    if (ar.endpoint == Endpoint::Completions) {
      for (const PromptInput& p : ar.prompts) out.push_back(completion_ids(p));
      return out;
    }
    if (!model().chat)
      throw RequestError("the model declares no supported chat template; use /v1/completions", "messages");
    try {
      out.push_back(model().chat->apply(ar.messages, true));
    } catch (const InvalidArgument& e) {
      throw RequestError(e.what(), "messages");
    }
    return out;
  }

  // The generation options of one prompt of a validated request. Throws RequestError.
  GenerateOptions options_for(const ApiRequest& ar, int64_t n_prompt) {
    const char* prompt_param = ar.endpoint == Endpoint::Completions ? "prompt" : "messages";
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
    g.stop_ids = model().stop_ids;
    g.top_logprobs = ar.top_logprobs;
    return g;
  }

  void generate(const httplib::Request& req, httplib::Response& res, Endpoint ep) {
    try {
      const ApiRequest ar = parse_request(req.body, ep, opts.defaults);
      std::vector<std::vector<TokenId>> prompts = prompt_ids(ar);
      std::vector<GenerateOptions> options;
      for (const auto& p : prompts) options.push_back(options_for(ar, static_cast<int64_t>(p.size())));

      std::optional<std::chrono::steady_clock::time_point> deadline;
      if (const int64_t ms = ar.deadline_ms.value_or(opts.default_deadline.count()); ms > 0)
        deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
      std::vector<Engine::Submission> subs;
      for (size_t i = 0; i < prompts.size(); ++i) subs.push_back({std::move(prompts[i]), std::move(options[i])});
      std::vector<std::shared_ptr<Request>> requests;
      try {
        requests = engine().submit_all(std::move(subs), ar.stop, deadline);  // all of them, or none
      } catch (const std::exception& e) {
        if (dynamic_cast<const InvalidArgument*>(&e)) throw RequestError(e.what());
        return send_unavailable(res, e.what(), dynamic_cast<const QueueFull*>(&e) ? retry_after() : 1);
      }
      ResponseMeta meta{ep, new_id(ep == Endpoint::Completions ? "cmpl-" : "chatcmpl-"), unix_now(),
                        opts.model_name};
      if (ar.stream) return stream(res, std::move(requests), std::move(meta), ar.include_usage, ar.top_logprobs >= 0);

      std::vector<Choice> choices;
      for (auto& request : requests) {
        std::vector<TokenLogprob> logprobs;
        std::string text = wait_watching_client(req, *request, logprobs);
        const RequestOutcome& o = request->outcome();
        if (!answered(o)) {
          // The client closed the connection: nobody reads this answer, and
          // it is not the server's failure. 499 as nginx counts it, so that
          // /metrics does not show it as unavailability (503).
          const bool client_left = o.reason == FinishReason::Cancelled && request->cancel_requested();
          for (auto& r : requests) r->cancel();
          if (client_left) return send_error(res, 499, "the client closed the connection", "client_closed_request");
          if (o.reason == FinishReason::Error) return send_error(res, 500, "generation failed: " + o.error, "server_error");
          return send_unavailable(res, o.error, o.reason == FinishReason::Deadline ? retry_after() : 1);
        }
        int64_t offset = 0;
        json lp = ar.top_logprobs >= 0 ? logprobs_json(ep, logprobs, offset) : json(nullptr);
        choices.push_back({std::move(text), o, std::move(lp)});
      }
      send_json(res, 200, response_json(meta, choices));
    } catch (const RequestError& e) {
      send_error(res, 400, e.what(), "invalid_request_error", e.param());
    } catch (const std::exception& e) {
      send_error(res, 500, std::string("internal error: ") + e.what(), "server_error");
    }
  }

  // Waits for a non-streaming request to end; cancels it when its client
  // closes the connection meanwhile (the slot is freed at the next step).
  static std::string wait_watching_client(const httplib::Request& http_req, Request& request,
                                          std::vector<TokenLogprob>& logprobs) {
    const int fd = find_connection_socket(http_req.local_addr, http_req.local_port, http_req.remote_addr,
                                          http_req.remote_port);
    std::string text;
    while (!request.poll(text, kClientCheck, &logprobs))
      if (fd >= 0 && !request.cancel_requested() && peer_closed(fd)) request.cancel();
    return text;
  }

  // Streams the choices of `requests` as server-sent events (SseStream).
  static void stream(httplib::Response& res, std::vector<std::shared_ptr<Request>> requests, ResponseMeta meta,
                     bool include_usage, bool logprobs) {
    auto st = std::make_shared<SseStream>(std::move(requests), std::move(meta), include_usage, logprobs);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        kEventStream,
        [st](size_t, httplib::DataSink& sink) {
          // Called repeatedly until done(); each call writes something, so a
          // client that has gone away is noticed by a failed write.
          const std::string out = st->next_events();
          if (!sink.write(out.data(), out.size())) {
            st->cancel();
            return false;
          }
          if (st->done()) sink.done();
          return true;
        },
        // Runs when the response is destroyed, however the stream ended;
        // a no-op for requests that already ended.
        [st](bool) { st->cancel(); });
  }
};


Server::Server(ServerOptions opts) {
  std::signal(SIGPIPE, SIG_IGN);
  impl_ = std::make_unique<Impl>(std::move(opts));
}

Server::~Server() { stop(); }

int Server::bind() {
  Impl& s = *impl_;
  // httplib's default options add SO_REUSEPORT, which lets a second server
  // bind a port that is already serving and share its connections; keep only
  // SO_REUSEADDR (rebinding right after a restart) so a taken port is an error.
  // The socket is the listening one: drain() shuts it down.
  s.http.set_socket_options([&s](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    s.listen_fd = sock;
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

void Server::attach(const LoadedModel& model, Engine& engine) {
  Impl& s = *impl_;
  s.ctx = s.opts.ctx_size > 0 ? s.opts.ctx_size : model.target->info().context;
  model.target->new_cache(s.ctx);  // refuses a context beyond the model's before serving
  s.model_ptr = &model;
  s.engine_ptr = &engine;
  s.ready = true;
}

void Server::drain() {
  Impl& s = *impl_;
  if (s.stopping.exchange(true)) return;
  // No new connections: the listening loop of the HTTP library sees accept()
  // fail and ends, then waits for the open connections. Its stop() would
  // also end the streams in progress (their writer checks it), so it is not
  // called here.
  if (const int fd = s.listen_fd.load(); fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

void Server::stop() {
  Impl& s = *impl_;
  if (s.stopping.exchange(true) && s.listen_fd.load() >= 0) {
    // After drain(): the listening socket is closed already (its descriptor
    // number may be reused); the connections end on their own.
    return;
  }
  s.http.stop();
}

}  // namespace dspark::serve

#endif  // DSPARK_HAVE_HTTPLIB
