// `dspark perplexity -m MODEL -f TEXT [-c N] [--chunks N]`: the target's
// perplexity on a text file, with llama-perplexity's chunking and scoring
// (see dspark/eval/perplexity.hpp), so the compute paths (--compute) and
// other engines can be compared on quality.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "common.hpp"
#include "dspark/error.hpp"
#include "dspark/eval/perplexity.hpp"
#include "dspark/io/atomic_file.hpp"
#include "dspark/io/regular_file.hpp"
#include "dspark/model/loaded_model.hpp"

namespace dspark::cli {

class PerplexityCommand : public Command {
 public:
  explicit PerplexityCommand(CLI::App& parent) {
    app_ = parent.add_subcommand("perplexity", "perplexity of the model on a text file (llama-perplexity semantics)");
    model_.add(*app_);
    app_->get_option("--ctx-size")->description("tokens per chunk (default 512, as llama-perplexity; 0 = the model's context)");
    app_->add_option("-f,--file", file_, "text file to score")->required();
    app_->add_option("--chunks", chunks_, "score at most N chunks (default: all)")->check(positive_integer());
    app_->add_option("--json", json_out_, "also write the result as JSON to this file")->check(path_text());
  }
  CLI::App* app() const { return app_; }

  int run() override {
    model_.apply_threads();
    io::require_regular_file(file_, "a text file (-f)");
    std::ifstream in(file_, std::ios::binary);
    if (!in) throw Error(file_ + ": cannot open");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!json_out_.empty()) prepare_output_file(json_out_, "--json");
    LoadedModel m = LoadedModel::load(model_.model, model_.compute_mode());
    const auto& sp = m.tokenizer->specials();
    std::vector<TokenId> ids;
    if (sp.add_bos && sp.bos >= 0) ids.push_back(sp.bos);
    const auto body = m.tokenizer->encode(text, false);
    ids.insert(ids.end(), body.begin(), body.end());

    eval::PerplexityOptions o;
    // As llama-perplexity: chunks of 512 tokens unless -c says otherwise;
    // -c 0 is the model's context.
    const bool ctx_given = app_->get_option("--ctx-size")->count() > 0;
    o.n_ctx = model_.ctx_size > 0 ? model_.ctx_size : ctx_given ? m.target->info().context : 512;
    o.max_chunks = chunks_ > 0 ? chunks_ : -1;
    o.bos = sp.add_bos ? sp.bos : -1;
    const int64_t n_chunks = eval::perplexity_chunks(*m.target, static_cast<int64_t>(ids.size()), o);
    std::printf("perplexity: %zu tokens, %lld chunks of %lld, compute %s\n", ids.size(),
                static_cast<long long>(n_chunks), static_cast<long long>(o.n_ctx), m.target->info().compute.c_str());
    const bool tty = isatty(fileno(stderr)) != 0;
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = eval::perplexity(*m.target, ids, o, [&](int64_t c, double ppl) {
      std::printf("[%lld]%.4f,", static_cast<long long>(c + 1), ppl);
      std::fflush(stdout);
      if (tty) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double rate = static_cast<double>((c + 1) * o.n_ctx) / s;
        std::fprintf(stderr, "\r%lld/%lld chunks | %.0f tok/s | ETA %.0f s   ", static_cast<long long>(c + 1),
                     static_cast<long long>(n_chunks), rate, static_cast<double>((n_chunks - c - 1) * o.n_ctx) / rate);
      }
    });
    if (tty) std::fprintf(stderr, "\r%60s\r", "");
    std::printf("\nFinal estimate: PPL = %.4f +/- %.5f (%lld tokens scored)\n", r.ppl, r.ppl_error,
                static_cast<long long>(r.scored));
    if (!json_out_.empty()) {
      nlohmann::json j = {{"model", m.target->info().id}, {"compute", m.target->info().compute},
                          {"file", file_},                {"n_ctx", o.n_ctx},
                          {"chunks", r.chunks},            {"scored", r.scored},
                          {"ppl", r.ppl},                  {"ppl_error", r.ppl_error},
                          {"nll", r.nll},                  {"running", r.running}};
      io::write_json_atomic(json_out_, j);
    }
    return 0;
  }

 private:
  CLI::App* app_;
  ModelOptions model_;
  std::string file_, json_out_;
  int64_t chunks_ = 0;
};

std::unique_ptr<Command> make_perplexity(CLI::App& app, CLI::App*& sub) {
  auto c = std::make_unique<PerplexityCommand>(app);
  sub = c->app();
  return c;
}

}  // namespace dspark::cli
