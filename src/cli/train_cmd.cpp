// `dspark train`: trains a DSpark drafter on a data set written by
// `dspark regen` (see include/dspark/train/trainer.hpp).
#include <cstdio>
#include <iostream>
#include <optional>

#include "common.hpp"
#include "dspark/error.hpp"
#include "dspark/model/loaded_model.hpp"
#include "dspark/model/target.hpp"
#include "dspark/speculative/checkpoint.hpp"
#include "dspark/train/data.hpp"
#include "dspark/train/draft_vocab.hpp"
#include "dspark/train/trainer.hpp"

namespace dspark::cli {

class TrainCommand : public Command {
 public:
  explicit TrainCommand(CLI::App& parent) {
    app_ = parent.add_subcommand("train", "train a DSpark drafter on regenerated data");
    model_.add(*app_);
    auto& c = cfg_;
    app_->add_option("--data", c.data_dirs,
                     "data set directory (dspark regen --out); repeat to train on several as one, in order")
        ->required();
    out_opt_ = app_->add_option("--out", c.out_dir, "output directory (drafter, checkpoints, metrics.jsonl)")->check(path_text());
    app_->add_option("--init", c.init_drafter, "start from this drafter directory (default: a fresh drafter)");
    app_->add_option("--head", head_, "sequential head of a fresh drafter: none, markov, gated, rnn, elman")
        ->capture_default_str();
    layers_opt_ = app_->add_option("--layers", c.drafter.n_layers,
                                   "draft layers of a fresh drafter; with --init, grow that drafter to this many "
                                   "(new layers start as the identity: zero output projections)")
                      ->check(integer_in(1, 32))
                      ->capture_default_str();
    app_->add_option("--gamma", c.drafter.gamma, "block size γ of a fresh drafter")->capture_default_str();
    app_->add_option("--markov-rank", c.drafter.markov_rank, "Markov rank r (multiple of 32)")
        ->capture_default_str();
    app_->add_option("--mask-token", c.drafter.mask_token_id,
                     "embedding row used as MASK (-1: a learned mask embedding)")
        ->capture_default_str();
    app_->add_option("--steps", c.steps, "optimizer steps")->check(positive_integer())->capture_default_str();
    app_->add_option("--batch", c.batch, "anchors per step")->check(positive_integer())->capture_default_str();
    app_->add_option("--anchors-per-seq", c.anchors_per_seq, "most anchors drawn from one sequence per step")
        ->check(positive_integer())
        ->capture_default_str();
    app_->add_option("--lr", c.lr, "peak learning rate")->capture_default_str();
    app_->add_option("--warmup", c.warmup, "fraction of steps of linear warmup")->capture_default_str();
    app_->add_option("--weight-decay", c.weight_decay, "decoupled weight decay (AdamW and Muon)")->capture_default_str();
    app_->add_option("--optimizer", optimizer_,
                     "adamw, or muon: Muon (momentum + Newton-Schulz orthogonalization) for the hidden matrices, "
                     "AdamW (--lr) for embeddings, output projections, norms and biases")
        ->capture_default_str();
    app_->add_option("--muon-lr", c.muon_lr, "Muon's peak learning rate (same warmup and cosine decay as --lr)")
        ->capture_default_str();
    app_->add_option("--muon-momentum", c.muon_momentum, "Muon's momentum (Nesterov)")->capture_default_str();
    app_->add_option("--muon-lr-scale", muon_scale_,
                     "Muon's per-matrix learning-rate scale: original (sqrt(max(1, rows/cols))) or "
                     "match-rms-adamw (0.2*sqrt(max(rows, cols)))")
        ->capture_default_str();
    app_->add_option("--grad-clip", c.grad_clip, "max global gradient norm (0: off)")->capture_default_str();
    app_->add_option("--w-ce", c.loss.w_ce, "weight of the cross-entropy term")->capture_default_str();
    app_->add_option("--w-l1,--w-tv", c.loss.w_l1, "weight of the total-variation term (sum |p_draft - p_target|)")
        ->capture_default_str();
    app_->add_option("--w-kl", c.loss.w_kl, "weight of the forward KL term KL(p_target || p_draft) (0: off)")
        ->capture_default_str();
    app_->add_option("--w-bce", c.loss.w_bce, "weight of the confidence (BCE) term")->capture_default_str();
    app_->add_option("--gamma-decay", c.loss.gamma_decay,
                     "position weight decay: w_k = exp(-(k-1)/gamma_decay) for draft position k (0: equal weights)")
        ->capture_default_str();
    app_->add_option("--anchors", anchors_,
                     "redraw: new random anchors of a sequence every epoch; fixed: the same random anchors "
                     "every epoch")
        ->capture_default_str();
    app_->add_option("--save-every", c.save_every, "checkpoint period in steps (0: at the end only)")
        ->capture_default_str();
    app_->add_option("--eval-every", c.eval_every, "evaluation period in steps (0: at the end only)")
        ->capture_default_str();
    app_->add_option("--log-every", c.log_every, "log period in steps")->check(positive_integer())->capture_default_str();
    app_->add_option("--seed", c.seed, "seed of init, data order and anchors")->capture_default_str();
    app_->add_option("--split-seed", split_seed_,
                     "seed of the held-out split (default: --seed); give runs that continue one another "
                     "(--init) the same one, so that none trains on another's held-out sequences");
    app_->add_option("--eval-fraction", c.eval_fraction, "share of sequences held out")->capture_default_str();
    app_->add_option("--eval-sequences", c.eval_max_sequences, "most held-out sequences")->capture_default_str();
    app_->add_option("--max-len", c.max_len, "truncate sequences to this many tokens (0: the context)")
        ->capture_default_str();
    app_->add_option("--feature-cache-mb", c.feature_cache_mb,
                     "keep target features of up to this many MiB in memory (0: recompute)")
        ->capture_default_str();
    app_->add_option("--feature-cache-dir", c.feature_cache_dir,
                     "keep target features on disk in DIR (bf16, one file per sequence; later passes and "
                     "runs skip the target)");
    app_->add_option("--precision", precision_, "matmul precision: bf16 or fp32")->capture_default_str();
    app_->add_option("--device", c.device,
                     "where to train: cpu, cuda or cuda:N (CUDA: a build against a CUDA libtorch; the "
                     "target's features are computed there too)")
        ->capture_default_str();
    app_->add_flag("--aten-only", c.aten_only,
                   "compute as on a GPU (the target in ATen ops, no dspark kernels) even on the CPU: checks "
                   "the device path");
    app_->add_option("--draft-vocab", draft_vocab_,
                     "give a fresh or --init drafter without one a draft vocabulary of this many of the "
                     "most frequent supervised tokens (plus the stop tokens), and train on it (0: none)")
        ->check(non_negative_integer())
        ->capture_default_str();
    app_->add_flag("--resume", c.resume, "continue from OUT/checkpoints/latest.json");
    app_->add_flag("--fill-feature-cache", fill_cache_,
                   "compute the target features of every sequence of --data missing from --feature-cache-dir, "
                   "store them and exit (rebuilds the cache later runs read)");
    app_->add_flag("--eval-only", c.eval_only,
                   "evaluate the --init drafter on every sequence of --data (teacher-forced "
                   "τ and loss; --eval-sequences caps them, default all) and exit; writes nothing");
    app_->add_option("--eval-anchors", c.eval_anchors_per_seq, "anchors drawn from each evaluated sequence")
        ->check(positive_integer())
        ->capture_default_str();
    eval_seq_opt_ = app_->get_option("--eval-sequences");
    app_->add_flag("-q,--quiet", quiet_, "no progress output");
  }
  CLI::App* app() const { return app_; }

  int run() override {
    if (precision_ == "bf16") cfg_.precision = train::MatmulPrecision::BFloat16;
    else if (precision_ == "fp32") cfg_.precision = train::MatmulPrecision::Float32;
    else throw InvalidArgument("--precision must be bf16 or fp32, got '" + precision_ + "'");
    cfg_.drafter.seq_head = parse_seq_head(head_);
    cfg_.optimizer = train::parse_optimizer(optimizer_);
    cfg_.muon_lr_scale = train::parse_muon_lr_scale(muon_scale_);
    cfg_.anchors = train::parse_anchor_draw(anchors_);
    if (!cfg_.init_drafter.empty() && layers_opt_->count() > 0) cfg_.grow_layers = cfg_.drafter.n_layers;
    if (split_seed_) cfg_.split_seed = *split_seed_;
    if (quiet_) cfg_.progress = train::Progress::None;
    if (cfg_.eval_only) {
      if (cfg_.init_drafter.empty()) throw InvalidArgument("--eval-only needs --init DRAFTER (the drafter to evaluate)");
      if (eval_seq_opt_->count() == 0) cfg_.eval_max_sequences = 0;  // all of them
      return evaluate_only();
    }
    if (out_opt_->count() == 0) throw InvalidArgument("--out is required (the run's output directory)");
    cfg_.validate();
    model_.apply_threads();
    std::unique_ptr<TargetModel> target;
    if (draft_vocab_ > 0 && needs_draft_vocab()) {
      LoadedModel m = LoadedModel::load(model_.model, model_.compute_mode());  // the stop ids come with the tokenizer
      target = std::move(m.target);
      const int64_t V = target->info().vocab;
      train::check_draft_vocab_size(draft_vocab_, V, "--draft-vocab", "train on the whole vocabulary");
      const train::TrainDataset data = train::TrainDataset::load(cfg_.data_dirs);
      const train::DraftVocab dv = train::select_draft_vocab(data, draft_vocab_, V, m.stop_ids);
      if (!quiet_)
        std::fprintf(stderr, "draft vocabulary: %zu of %lld tokens; covers %.2f%% of %lld supervised tokens\n",
                     dv.ids.size(), static_cast<long long>(V), 100.0 * dv.coverage(),
                     static_cast<long long>(dv.supervised));
      cfg_.drafter.draft_vocab = dv.ids;
    } else {
      target = load_target(model_.model, model_.compute_mode());
    }
    train::Trainer trainer(cfg_, *target);
    if (fill_cache_) {
      const int64_t n = trainer.fill_feature_cache();
      std::printf("feature cache %s: %lld sequences computed\n", cfg_.feature_cache_dir.c_str(),
                  static_cast<long long>(n));
      return 0;
    }
    train::EvalStats ev = trainer.run();
    const auto& a = ev.acceptance;
    std::printf("step %lld: eval loss %.4f | tau greedy %.3f | tau sample %.3f (%s, %lld anchors) -> %s\n",
                static_cast<long long>(trainer.steps_done()), ev.loss, a.mean_tau_greedy(), a.mean_tau_sample(),
                ev.held_out ? "held-out" : "training split", static_cast<long long>(a.anchors),
                cfg_.out_dir.c_str());
    return 0;
  }

 private:
  // Whether --draft-vocab selects one: not on --resume (the checkpoint's
  // drafter config applies) nor for an --init drafter that has one.
  bool needs_draft_vocab() const {
    const char* skip = nullptr;
    if (cfg_.resume) {
      skip = "--resume continues with the checkpoint's drafter config";
    } else if (!cfg_.init_drafter.empty()) {
      const nlohmann::json j = read_drafter_json(cfg_.init_drafter);
      if (!config_from_json(j, cfg_.init_drafter).draft_vocab.empty())
        skip = "the --init drafter has its own draft vocabulary";
    }
    if (skip && !quiet_) std::fprintf(stderr, "--draft-vocab ignored: %s\n", skip);
    return skip == nullptr;
  }

  // --eval-only: the proxy of docs/training.md, τ of a drafter teacher-forced
  // on a data set (e.g. `regen` of prompts no run trained on).
  int evaluate_only() {
    cfg_.validate();
    model_.apply_threads();
    std::unique_ptr<TargetModel> target = load_target(model_.model, model_.compute_mode());
    train::Trainer trainer(cfg_, *target);
    const train::EvalStats ev = trainer.evaluate();
    const auto& a = ev.acceptance;
    std::printf("eval of %s on %s: %lld sequences, %lld anchors | loss %.4f | tau greedy %.3f | tau sample %.3f | acc",
                cfg_.init_drafter.c_str(), cfg_.data_label().c_str(), static_cast<long long>(ev.sequences),
                static_cast<long long>(a.anchors), ev.loss, a.mean_tau_greedy(), a.mean_tau_sample());
    for (double v : a.acceptance_by_position()) std::printf(" %.2f", v);
    std::printf("\n");
    return 0;
  }

  CLI::App* app_;
  CLI::Option* out_opt_ = nullptr;
  CLI::Option* eval_seq_opt_ = nullptr;
  CLI::Option* layers_opt_ = nullptr;
  ModelOptions model_;
  train::TrainConfig cfg_;
  std::string head_ = "markov", precision_ = "bf16", optimizer_ = "adamw", muon_scale_ = "original",
              anchors_ = "redraw";
  int64_t draft_vocab_ = 0;
  std::optional<uint64_t> split_seed_;
  bool quiet_ = false, fill_cache_ = false;
};

std::unique_ptr<Command> make_train(CLI::App& app, CLI::App*& sub) {
  auto c = std::make_unique<TrainCommand>(app);
  sub = c->app();
  return c;
}

}  // namespace dspark::cli
