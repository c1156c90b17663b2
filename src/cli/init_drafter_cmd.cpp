// `dspark init-drafter`: writes a randomly initialized drafter for a target.
#include <filesystem>
#include <iostream>

#include "common.hpp"
#include "dspark/error.hpp"
#include "dspark/model/target.hpp"
#include "dspark/speculative/checkpoint.hpp"

namespace dspark::cli {

class InitDrafterCommand : public Command {
 public:
  explicit InitDrafterCommand(CLI::App& parent) {
    app_ = parent.add_subcommand("init-drafter", "write a randomly initialized DSpark drafter");
    model_.add(*app_);
    app_->add_option("--out", out_, "output directory")->check(path_text())->required();
    app_->add_option("--head", head_, "sequential head: none, markov, gated, rnn, elman")
        ->capture_default_str();
    app_->add_option("--layers", cfg_.n_layers, "draft layers")->capture_default_str();
    app_->add_option("--gamma", cfg_.gamma, "block size γ")->capture_default_str();
    app_->add_option("--markov-rank", cfg_.markov_rank, "Markov rank r (multiple of 32)")
        ->capture_default_str();
    app_->add_option("--mask-token", cfg_.mask_token_id,
                     "embedding row used as MASK (-1: a learned mask embedding)")
        ->capture_default_str();
    app_->add_option("--seed", seed_, "initialization seed")->capture_default_str();
    app_->add_flag("--force", force_, "replace a drafter already in --out");
  }
  CLI::App* app() const { return app_; }

  int run() override {
    refuse_existing_drafter(out_, force_);
    model_.apply_threads();
    auto target = load_target(model_.model, model_.compute_mode());
    cfg_.seq_head = parse_seq_head(head_);
    cfg_.complete_from(target->info());
    Drafter d = Drafter::init(cfg_, seed_);
    save_drafter(d, out_, /*bf16=*/false);
    std::cerr << "wrote " << out_ << " (" << to_string(cfg_.seq_head) << " head, " << cfg_.n_layers
              << (cfg_.n_layers == 1 ? " layer" : " layers") << ", gamma " << cfg_.gamma << ", target " << cfg_.target_id << ")\n";
    return 0;
  }

 private:
  CLI::App* app_;
  ModelOptions model_;
  DrafterConfig cfg_;
  std::string out_, head_ = "markov";
  uint64_t seed_ = 0;
  bool force_ = false;
};

std::unique_ptr<Command> make_init_drafter(CLI::App& app, CLI::App*& sub) {
  auto c = std::make_unique<InitDrafterCommand>(app);
  sub = c->app();
  return c;
}

}  // namespace dspark::cli
