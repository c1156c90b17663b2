// `dspark regen`: the target answers a prompts file itself (self-distillation)
// and the responses are stored as drafter training data; see train/regen.hpp.
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "common.hpp"
#include "dspark/error.hpp"
#include "dspark/model/loaded_model.hpp"
#include "dspark/train/regen.hpp"

namespace dspark::cli {

namespace {

std::string clock_text(double s) {
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  return buf;
}

std::string progress_text(const train::RegenProgress& p) {
  char buf[200], rate[32];
  // The rate after the first second (tokens_per_s() is 0 before).
  if (p.elapsed_s >= 1.0)
    std::snprintf(rate, sizeof rate, "%.1f", p.tokens_per_s());
  else
    std::snprintf(rate, sizeof rate, "?");
  std::snprintf(buf, sizeof buf, "%lld/%lld prompts | %lld stored, %lld dropped | %lld shards | %s tok/s | ETA %s",
                static_cast<long long>(p.done), static_cast<long long>(p.total),
                static_cast<long long>(p.stored), static_cast<long long>(p.dropped),
                static_cast<long long>(p.shards), rate,
                p.eta_s() > 0 && p.done < p.total ? clock_text(p.eta_s()).c_str() : p.done < p.total ? "?" : "done");
  return buf;
}

}  // namespace

class RegenCommand : public Command {
 public:
  explicit RegenCommand(CLI::App& parent) {
    app_ = parent.add_subcommand(
        "regen", "generate drafter training data: the target answers every prompt itself");
    model_.add(*app_);
    app_->add_option("--prompts", prompts_, "JSONL file with 'id', 'prompt' (and 'kind')")->required();
    app_->add_option("--out", out_, "output directory (resumed when it exists)")->check(path_text())->required();
    app_->add_option("-n,--n-predict", opts_.n_predict, "maximum response tokens")
        ->check(positive_integer())
        ->capture_default_str();
    app_->add_option("--batch", opts_.batch, "sequences decoded together per target call")
        ->check(integer_in(1, 1024))
        ->capture_default_str();
    app_->add_option("--limit", opts_.limit, "use only the first N prompts (0 = all)")
        ->check(non_negative_integer());
    app_->add_option("--shard-size", opts_.shard_sequences, "sequences per shard")
        ->check(positive_integer())
        ->capture_default_str();
    app_->add_option("--min-supervised", opts_.min_supervised,
                     "drop responses with fewer tokens than this")
        ->check(non_negative_integer())
        ->capture_default_str();
    app_->add_option("--log-every", log_every_, "without a terminal: one progress line every N shards")
        ->check(positive_integer())
        ->capture_default_str();
    app_->add_flag("--save-text", opts_.save_text, "also store decoded responses in shard metadata");
    app_->add_flag("--raw", raw_, "do not apply the chat template");
    // The paper's self-distillation sampling (T 0.7, top-p 0.8, top-k 20).
    add_sampling_options(*app_, opts_.sampling);
  }
  CLI::App* app() const { return app_; }

  int run() override {
    opts_.sampling.validate();
    opts_.chat = !raw_;
    opts_.prompts_file = prompts_;
    opts_.ctx_size = model_.ctx_size;
    model_.apply_threads();
    const auto prompts = train::read_prompts_jsonl(prompts_);
    LoadedModel m = LoadedModel::load(model_.model, model_.compute_mode());

    const bool tty = isatty(fileno(stderr));
    double last_print = -1;
    opts_.on_progress = [&](const train::RegenProgress& p) {
      if (tty) {
        if (p.shard_written || p.elapsed_s - last_print >= 0.5) {
          std::fprintf(stderr, "\r%-110s", progress_text(p).c_str());
          std::fflush(stderr);
          last_print = p.elapsed_s;
        }
      } else if (p.shard_written && p.shards_this_run % log_every_ == 0) {
        std::fprintf(stderr, "regen: %s | %s\n", clock_text(p.elapsed_s).c_str(), progress_text(p).c_str());
      }
      return true;
    };
    const train::RegenSummary s = train::regenerate(m, prompts, out_, opts_);
    if (tty) std::fprintf(stderr, "\r%110s\r", "");
    const double tps = s.elapsed_s > 0 ? s.generated_tokens / s.elapsed_s : 0.0;
    std::printf("%s: %lld sequences (%lld tokens, %lld supervised), %lld dropped, %lld shards%s\n",
                out_.c_str(), static_cast<long long>(s.n_sequences), static_cast<long long>(s.n_tokens),
                static_cast<long long>(s.n_supervised), static_cast<long long>(s.n_dropped),
                static_cast<long long>(s.shards), s.complete ? "" : " (incomplete)");
    std::printf("this run: %lld prompts already done, %lld tokens generated in %.1f s (%.1f tok/s, batch %lld)\n",
                static_cast<long long>(s.skipped_existing), static_cast<long long>(s.generated_tokens),
                s.elapsed_s, tps, static_cast<long long>(opts_.batch));
    return 0;
  }

 private:
  CLI::App* app_;
  ModelOptions model_;
  train::RegenOptions opts_;
  std::string prompts_, out_;
  int64_t log_every_ = 1;
  bool raw_ = false;
};

std::unique_ptr<Command> make_regen(CLI::App& app, CLI::App*& sub) {
  auto c = std::make_unique<RegenCommand>(app);
  sub = c->app();
  return c;
}

}  // namespace dspark::cli
