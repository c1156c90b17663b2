// `dspark serve`: an OpenAI-compatible HTTP server that batches speculative
// decoding across requests (docs/serving.md).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>

#include <ATen/Parallel.h>

#include "common.hpp"
#include "drafter_options.hpp"
#include "dspark/error.hpp"
#include "dspark/model/loaded_model.hpp"
#include "dspark/serve/auth.hpp"
#include "dspark/serve/engine.hpp"
#include "dspark/serve/server.hpp"
#include "dspark/speculative/sps_profile.hpp"

namespace dspark::cli {

class ServeCommand : public Command {
 public:
  explicit ServeCommand(CLI::App& parent) {
    app_ = parent.add_subcommand("serve", "serve the model over an OpenAI-compatible HTTP API");
    model_.add(*app_);
    drafter_.add(*app_, /*with_schedule=*/false);
    app_->add_option("--host", host_, "address to listen on")->capture_default_str();
    app_->add_option("--port", port_, "port to listen on (0: any free port)")
        ->check(integer_in(0, 65535))
        ->capture_default_str();
    app_->add_option("--parallel", parallel_, "requests decoded together (batch slots)")
        ->check(integer_in(1, 1024))
        ->capture_default_str();
    app_->add_option("-n,--n-predict", n_predict_, "max_tokens for requests that set none")
        ->check(positive_integer())
        ->capture_default_str();
    app_->add_option("--sps", sps_,
                     "SPS profile for the prefix scheduler and the prefill budget by time: 'auto' (the "
                     "`dspark profile` file of the model, measured and saved on first use), 'measure' "
                     "(profile at startup), 'none' (verify every drafted position; fixed prefill budget) or a "
                     "profile file")
        ->capture_default_str();
    app_->add_option("-a,--alias", alias_,
                     "the model's name in responses and /v1/models (default: the -m value's file stem, which "
                     "for an alias such as smollm2 is the alias)");
    app_->add_option("--http-threads", http_threads_, "HTTP worker threads kept ready (0: 4 x parallel + 16)")
        ->check(integer_in(0, 4096));
    app_->add_option("--http-max-threads", http_max_threads_,
                     "most HTTP worker threads: each open connection holds one, and more start while every one "
                     "is busy")
        ->check(integer_in(1, 65536));
    add_sampling_options(*app_, sampling_);
    // Requests that name a seed always get seed-stable text; this is the
    // rule of the others ("auto": kUnseededRule).
    rule_.add(*app_, nullptr);
    app_->add_option("--api-key", api_keys_,
                     "API key clients must send as 'Authorization: Bearer KEY' on /v1/* (repeatable, or "
                     "comma-separated as llama.cpp takes them; /health and /metrics stay open)")
        ->delimiter(',');
    app_->add_option("--api-key-file", api_key_file_, "a file of API keys, one per line");
    app_->add_option("--max-queue", max_queue_,
                     "requests that may wait for a slot; beyond them a request gets 503 with Retry-After "
                     "(0: no limit)")
        ->check(non_negative_integer())
        ->capture_default_str();
    app_->add_option("--shutdown-timeout", shutdown_timeout_,
                     "on SIGTERM/SIGINT: seconds requests in flight may take to finish before they are "
                     "cancelled (a second signal cancels them at once)")
        ->check(number_in(0.0, 86400.0))
        ->capture_default_str();
    app_->add_option("--deadline", deadline_,
                     "seconds after arrival by which a request ends (its \"deadline_ms\" field overrides it; "
                     "0: none)")
        ->check(number_in(0.0, 86400.0))
        ->capture_default_str();
    app_->add_option("--prefill-budget", prefill_budget_,
                     "chunked prefill: prompt work per step in target-row equivalents (a token at context c "
                     "costs 1 + c/L; 0: whole prompts)")
        ->check(non_negative_integer())
        ->capture_default_str();
    app_->add_option("--prefill-slowdown", prefill_slowdown_,
                     "while requests decode, a step carries no more prompt work than keeps it within this many "
                     "times their decoding alone, by the SPS profile (0: --prefill-budget alone)")
        ->check(number_in(0.0, 1000.0))
        ->capture_default_str();
  }
  CLI::App* app() const { return app_; }

  int run() override {
    sampling_.validate();
    sampling_.rule = rule_.resolve();
    serve::ServerOptions so;
    so.host = host_;
    so.port = port_;
    so.model_name = model_name();
    so.ctx_size = model_.ctx_size;
    so.default_max_tokens = n_predict_;
    so.defaults = sampling_;
    so.parallel = parallel_;
    so.http_threads = http_threads_;
    so.http_max_threads = http_max_threads_;
    so.default_deadline = std::chrono::milliseconds(static_cast<int64_t>(deadline_ * 1000));
    for (const std::string& k : api_keys_) so.api_keys.add(k);
    if (!api_key_file_.empty()) so.api_keys.add_file(api_key_file_);

#ifdef __GLIBC__
    // Requests' KV caches (per layer, 0.2-3 MB for SmolLM2) are mapped and
    // unmapped, not carved from the heap: glibc raises its mmap threshold to
    // the size of every mapped block freed, after which such blocks come from
    // the heaps of whichever threads freed them and fragment them, and a long
    // soak's RSS kept growing while the server stayed busy (malloc_trim runs
    // only when it goes idle). Setting the threshold fixes it.
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    // Two heaps, not one per concurrent HTTP thread up to 8 per core: each
    // heap keeps the freed memory of its busiest moment, so with one per
    // thread the RSS followed the number of concurrent clients. The threads
    // allocate little (JSON, text) and briefly.
    mallopt(M_ARENA_MAX, 2);
#endif
    // SIGINT/SIGTERM are taken with sigwait() below; block them here, before
    // any other thread starts, so every thread inherits the mask.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

    // Listen first: while the model loads, /health says "loading" (as
    // llama.cpp's server does), so a load balancer can tell it apart from
    // a dead replica.
    serve::Server server(so);
    const int port = server.bind();
    if (!serve::is_loopback(host_) && so.api_keys.empty())
      std::cerr << "warning: listening on " << host_ << " without an API key: anyone who reaches port " << port
                << " can use the model (--api-key or --api-key-file)" << std::endl;
    std::cerr << "dspark serve: listening on http://" << host_ << ":" << port << " (loading " << so.model_name
              << ")" << std::endl;
    std::atomic<bool> draining{false};
    std::thread http([&] {
      server.listen();
      // A listening socket that fails ends the server too: wake sigwait.
      if (!draining) kill(getpid(), SIGTERM);
    });
    struct Join {
      serve::Server& server;
      std::thread& http;
      ~Join() {
        server.stop();
        if (http.joinable()) http.join();
      }
    } join{server, http};

    model_.apply_threads();
    LoadedModel m = LoadedModel::load(model_.model, model_.compute_mode());
    const auto drafter = drafter_.load(model_.model, *m.target);
    serve::EngineOptions eo;
    eo.parallel = parallel_;
    eo.spec = drafter_.spec();
    eo.prefill_budget = prefill_budget_;
    eo.prefill_slowdown = prefill_slowdown_;
    eo.max_queue = max_queue_;
    // Plain decoding uses the curve for the prefill budget alone.
    eo.sps = sps_curve(*m.target, drafter.get());
    serve::Engine engine(*m.target, *m.tokenizer, drafter.get(), eo);
    server.attach(m, engine);
    std::cerr << "dspark serve: " << so.model_name << " ("
              << (engine.speculative() ? (eo.sps.empty() ? "speculative" : "speculative, scheduled") : "plain")
              << ", parallel " << parallel_ << ", max queue " << max_queue_
              << (so.api_keys.empty() ? "" : ", API keys " + std::to_string(so.api_keys.size())) << ") ready"
              << std::endl;

    int sig = 0;
    sigwait(&stop_signals, &sig);
    draining = true;
    drain(server, engine, stop_signals);
    http.join();  // every connection closed: nothing uses the engine any more
    std::cerr << "dspark serve: stopped" << std::endl;
    return 0;
  }

 private:
  // Graceful shutdown: no new connections or requests; what is in flight
  // gets --shutdown-timeout to finish (a second signal ends the wait), then
  // the rest is cancelled — streams end with an error event and [DONE],
  // other requests get 503. Returns once every connection has closed.
  void drain(serve::Server& server, serve::Engine& engine, const sigset_t& signals) const {
    server.drain();
    std::cerr << "dspark serve: shutting down (" << shutdown_timeout_ << " s for requests in flight)" << std::endl;
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(shutdown_timeout_ * 1000));
    while (std::chrono::steady_clock::now() < until) {
      const serve::EngineLoad l = engine.load();
      if (l.active == 0 && l.queued == 0) break;
      const timespec poll{0, 100'000'000};
      if (sigtimedwait(&signals, nullptr, &poll) > 0) break;
    }
    engine.shutdown();
  }

  // The SPS curve the --sps option asks for (empty: no scheduling, and the
  // fixed prefill budget alone).
  std::vector<double> sps_curve(TargetModel& target, const Drafter* drafter) const {
    if (sps_ == "none") return {};
    const int gamma = std::max(drafter_.gamma > 0 ? drafter_.gamma : drafter ? drafter->gamma() : 0,
                               drafter_.lookup.enabled() ? drafter_.lookup.max_draft : 0);
    SpsProfileOptions po;
    po.bmax = std::clamp<int>(parallel_ * (gamma + 1), 16, 256);
    po.context = 64;
    po.repetitions = 3;
    if (sps_ == "measure") {
      std::cerr << "measuring SPS(B) for B = 1.." << po.bmax << " ..." << std::endl;
      return measure_sps(target, po).sps;
    }
    // As `generate` does: measured on first use, then kept current.
    if (sps_ == "auto") {
      const std::string path = default_profile_path(sps_profile_key(target.info()), at::get_num_threads());
      return current_sps_profile(target, path, po, &std::cerr);
    }
    SpsProfile prof = load_sps_profile(sps_);
    if (const std::string w = sps_profile_mismatch(prof, sps_, sps_profile_key(target.info())); !w.empty())
      std::cerr << "warning: " << w << "\n";
    make_sps_monotone(prof.sps);
    return prof.sps;
  }

  // --alias, else the -m value's file stem ("smollm2", "SmolLM2-135M-Instruct.Q4_1").
  std::string model_name() const {
    if (!alias_.empty()) return alias_;
    std::string stem = std::filesystem::path(model_.model).filename().string();
    if (stem.size() > 5 && stem.ends_with(".gguf")) stem.resize(stem.size() - 5);
    return stem.empty() ? "dspark" : stem;
  }

  CLI::App* app_;
  ModelOptions model_;
  DrafterOptions drafter_;
  SamplingParams sampling_;
  RuleOption rule_;
  int64_t prefill_budget_ = 64;
  double prefill_slowdown_ = 2;
  std::string host_ = "127.0.0.1";
  int port_ = 8080;
  int parallel_ = 8;
  int64_t n_predict_ = 256;
  std::string sps_ = "auto";
  std::string alias_;
  std::vector<std::string> api_keys_;
  std::string api_key_file_;
  int max_queue_ = 32;
  double shutdown_timeout_ = 20;
  double deadline_ = 0;
  int http_threads_ = 0;
  int http_max_threads_ = 1024;
};

std::unique_ptr<Command> make_serve(CLI::App& app, CLI::App*& sub) {
  auto c = std::make_unique<ServeCommand>(app);
  sub = c->app();
  return c;
}

}  // namespace dspark::cli
