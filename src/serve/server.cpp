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
// How long a stream of several choices waits on one of them before looking
// at the next.
constexpr std::chrono::milliseconds kMultiPoll{20};

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
  struct ChoiceStream {
    std::shared_ptr<Request> req;
    bool ended = false;
    int64_t text_offset = 0;  // characters sent, for completions logprobs
  };
  std::vector<ChoiceStream> choices;
  ResponseMeta meta;
  bool include_usage = false;
  bool logprobs = false;
  bool started = false;
  bool done = false;
  std::vector<RequestOutcome> outcomes;

  void cancel() {
    for (auto& c : choices) c.req->cancel();
  }

  // The events of one call of the content provider: what the choices have
  // produced (waiting up to the keep-alive interval for something), or a
  // keep-alive comment.
  std::string next_events() {
    std::string out;
    if (!started) {
      started = true;
      if (meta.endpoint == Endpoint::ChatCompletions) out += sse_event(role_chunk_json(meta));
    }
    const bool one = choices.size() == 1;
    const auto until = std::chrono::steady_clock::now() + kKeepAlive;
    do {
      for (size_t i = 0; i < choices.size(); ++i) {
        ChoiceStream& c = choices[i];
        if (c.ended) continue;
        std::string text;
        std::vector<TokenLogprob> lp;
        // One choice waits on its channel; several poll in turn.
        const auto wait = out.empty() ? (one ? kKeepAlive : kMultiPoll) : std::chrono::milliseconds(0);
        c.ended = c.req->poll(text, wait, logprobs ? &lp : nullptr);
        const auto index = static_cast<int>(i);
        if (!text.empty() || !lp.empty())
          out += sse_event(chunk_json(meta, text, logprobs ? logprobs_json(meta.endpoint, lp, c.text_offset) : json(nullptr),
                                      index));
        if (!c.ended) continue;
        const RequestOutcome& o = c.req->outcome();
        if (o.reason == FinishReason::Stop || o.reason == FinishReason::Length) {
          out += sse_event(final_chunk_json(meta, o, index));
          outcomes.push_back(o);
          continue;
        }
        // A choice that failed or was cancelled ends the whole stream.
        cancel();
        out += sse_event(error_body(o.reason == FinishReason::Error ? "generation failed: " + o.error : o.error,
                                    "server_error"));
        out += "data: [DONE]\n\n";
        done = true;
        return out;
      }
    } while (out.empty() && std::chrono::steady_clock::now() < until);
    if (std::all_of(choices.begin(), choices.end(), [](const ChoiceStream& c) { return c.ended; })) {
      if (include_usage) out += sse_event(usage_chunk_json(meta, combined(outcomes)));
      out += "data: [DONE]\n\n";
      done = true;
    }
    if (out.empty()) out = ": keep-alive\n\n";
    return out;
  }
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
    http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) { tokenize(req, res); });
    http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) { detokenize(req, res); });
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
      send_json(res, 200, {{"tokens", add ? model.encode_prompt(text, false) : model.tokenizer->encode(text, true)}});
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
      const int64_t vocab = model.target->info().vocab;
      for (const json& t : *tokens) {
        if (!(t.is_number_integer() || t.is_number_unsigned()) || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
          throw RequestError("'tokens': expected token ids in [0, " + std::to_string(vocab) + "), got " + t.dump(), "tokens");
        ids.push_back(static_cast<TokenId>(t.get<int64_t>()));
      }
      send_json(res, 200, {{"content", model.tokenizer->decode(ids)}});
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
    const int64_t vocab = model.target->info().vocab;
    for (size_t i = 0; i < prompt.size(); ++i) {
      const PromptPiece& piece = prompt[i];
      if (piece.is_text) {
        const auto t = i == 0 ? model.encode_prompt(piece.text, false) : model.tokenizer->encode(piece.text, true);
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
    if (!model.chat)
      throw RequestError("the model declares no supported chat template; use /v1/completions", "messages");
    try {
      out.push_back(model.chat->apply(ar.messages, true));
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
    g.stop_ids = model.stop_ids;
    g.top_logprobs = ar.top_logprobs;
    return g;
  }

  void generate(const httplib::Request& req, httplib::Response& res, Endpoint ep) {
    try {
      if (stopping) return send_error(res, 503, "the server is shutting down", "server_error");
      const ApiRequest ar = parse_request(req.body, ep, opts.defaults);
      std::vector<std::vector<TokenId>> prompts = prompt_ids(ar);
      std::vector<GenerateOptions> options;
      for (const auto& p : prompts) options.push_back(options_for(ar, static_cast<int64_t>(p.size())));

      std::vector<std::shared_ptr<Request>> requests;
      try {
        for (size_t i = 0; i < prompts.size(); ++i)
          requests.push_back(engine.submit(std::move(prompts[i]), std::move(options[i]), ar.stop));
      } catch (const std::exception& e) {
        for (auto& r : requests) r->cancel();
        if (dynamic_cast<const InvalidArgument*>(&e)) throw RequestError(e.what());
        return send_error(res, 503, e.what(), "server_error");
      }
      ResponseMeta meta{ep, new_id(ep == Endpoint::Completions ? "cmpl-" : "chatcmpl-"), unix_now(),
                        opts.model_name};
      if (ar.stream) return stream(res, std::move(requests), std::move(meta), ar.include_usage, ar.top_logprobs >= 0);

      std::vector<Choice> choices;
      for (auto& request : requests) {
        std::vector<TokenLogprob> logprobs;
        std::string text = wait_watching_client(req, *request, logprobs);
        const RequestOutcome& o = request->outcome();
        if (o.reason == FinishReason::Cancelled || o.reason == FinishReason::Error) {
          for (auto& r : requests) r->cancel();
          if (o.reason == FinishReason::Cancelled) return send_error(res, 503, o.error, "server_error");
          return send_error(res, 500, "generation failed: " + o.error, "server_error");
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

  // Streams the choices of `requests` as server-sent events (each choice's
  // chunks carry its index; a failed or cancelled choice ends the stream
  // with an error event and cancels the others).
  void stream(httplib::Response& res, std::vector<std::shared_ptr<Request>> requests, ResponseMeta meta,
              bool include_usage, bool logprobs) {
    auto st = std::make_shared<StreamState>();
    for (auto& r : requests) st->choices.push_back({std::move(r)});
    st->meta = std::move(meta);
    st->include_usage = include_usage;
    st->logprobs = logprobs;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        kEventStream,
        [st](size_t, httplib::DataSink& sink) {
          // Called repeatedly until done(); each call writes something, so a
          // client that has gone away is noticed by a failed write.
          std::string out = st->next_events();
          if (!sink.write(out.data(), out.size())) {
            st->cancel();
            return false;
          }
          if (st->done) sink.done();
          return true;
        },
        // Runs when the response is destroyed, however the stream ended;
        // a no-op for requests that already ended.
        [st](bool) { st->cancel(); });
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
