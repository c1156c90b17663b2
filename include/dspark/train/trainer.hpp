// dspark/train/trainer.hpp — the drafter trainer behind `dspark train`
// (dspark-method.md §4).
//
// Each step draws `batch` anchors: sequences are visited in a seeded random
// order (a new permutation per epoch), and up to `anchors_per_seq` anchors are
// sampled from each (see sample_anchors): a new random draw at every visit,
// i.e. every epoch (AnchorDraw::Redraw, from the trainer's checkpointed RNG),
// or the same draw every epoch (AnchorDraw::Fixed, seeded by the sequence). For every visited sequence the
// target is run once over its tokens with hidden-state taps (context features
// and the final-normed hidden, from which the target distributions come;
// see below for keeping them). The drafter's teacher-forced forward
// (DrafterGraph) and the DSpark loss (Eq. 9-12) are evaluated per sequence and
// back-propagated, normalized by the batch's total position weight, so the
// step's gradient is that of the w-weighted mean over the whole batch. Then:
// global gradient-norm clipping, AdamW or Muon for the hidden matrices and
// AdamW for the rest (optimizer.hpp; fp32 master weights; target, embedding
// and LM head frozen), learning rate with linear warmup and cosine decay to 0
// (Muon's learning rate follows the same schedule, scaled to muon_lr).
//
// A drafter with a draft vocabulary (DrafterConfig::draft_vocab) is trained
// and evaluated on exactly the distribution it drafts from: logits over the
// draft vocabulary only and the target distribution restricted to it, the
// mass outside counting in L1 (see loss.hpp). The target's full-vocabulary
// logsumexp and argmax per position are then computed with its features
// (and cached with them).
//
// Target features are recomputed on every visit unless kept: in memory
// (feature_cache_mb, least recently used out first) and/or on disk
// (feature_cache_dir, DiskFeatureCache: one file per sequence, reused by later
// passes and later runs with the same target, taps, max_len and precision).
// Either way a step equals a recomputed step bit for bit.
//
// Output directory layout:
//   OUT/dspark.json, OUT/model.safetensors   the drafter, bf16 (loadable by
//                                             generate/bench), rewritten at
//                                             every checkpoint and at the end
//   OUT/checkpoints/step-NNNNNNNN/           fp32 drafter (save_drafter),
//        optimizer.pt                        optimizer state (torch serialization)
//        trainer_state.json                  step, data order, RNG, config
//   OUT/checkpoints/latest.json              {"step", "dir"}: written last and
//                                             atomically; resume reads it
//   OUT/metrics.jsonl                        one JSON object per logged step
//        (step, loss, ce, l1, bce, kl, lr, grad_norm, steps_per_s, anchors_per_s,
//        target_tokens_per_s, target_time_share) or evaluation (eval_step,
//        loss terms, tau_greedy, tau_sample, acceptance_by_position, ...)
// Every file is replaced atomically, and a checkpoint becomes visible only
// when latest.json names it, so a crash never leaves a half checkpoint in use.
// Resuming restores parameters, optimizer moments, step, data order and RNG,
// so a resumed run continues bit-for-bit like an uninterrupted one.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dspark/model/target.hpp"
#include "dspark/speculative/drafter.hpp"
#include "dspark/train/loss.hpp"
#include "dspark/train/optimizer.hpp"

namespace dspark::train {

/// How the anchors of a sequence are chosen at each visit (one per epoch).
enum class AnchorDraw {
  Redraw,  // a new random draw every visit (DSpark's recipe: random anchors re-drawn each epoch)
  Fixed,   // one random draw per sequence (seeded by seed and sequence), reused every epoch
};
std::string to_string(AnchorDraw a);
/// "redraw" | "fixed"; throws InvalidArgument otherwise.
AnchorDraw parse_anchor_draw(const std::string& s);

/// How progress is printed (to stderr).
enum class Progress {
  Auto,   // a live line when stderr is a terminal, else Lines
  Live,   // one line rewritten every step (\r), evaluations on their own lines
  Lines,  // one line every log_every steps
  None,   // silent (metrics.jsonl is still written)
};

struct TrainConfig {
  /// Data sets (see data.hpp), trained on as one in this order.
  std::vector<std::string> data_dirs;
  /// data_dirs for messages: "A" or "A + B".
  std::string data_label() const;
  std::string out_dir;         // output directory (see above)
  /// Start from this drafter directory (e.g. `dspark init-drafter` output);
  /// empty: a fresh drafter from `drafter`, completed from the target.
  std::string init_drafter;
  /// Used when init_drafter is empty. Its draft_vocab, when non-empty, also
  /// applies to an init drafter that has none; an init or resumed drafter
  /// with a different draft vocabulary is refused (InvalidArgument).
  DrafterConfig drafter;
  /// With init_drafter: grow it to this many draft layers (> its own; 0:
  /// keep). The new layers come after the existing ones, with their output
  /// projections (attn_output, ffn_down) at zero, so the grown drafter starts
  /// as exactly the init drafter (see grow_drafter).
  int grow_layers = 0;
  int64_t steps = 1000;        // optimizer steps in total
  int batch = 64;              // anchors per step
  int anchors_per_seq = 32;    // at most this many anchors from one sequence per step
  double lr = 6e-4;            // peak learning rate
  double warmup = 0.04;        // fraction of steps with linear warmup
  double weight_decay = 0.0;   // decoupled weight decay (AdamW and Muon)
  double grad_clip = 1.0;      // max global gradient L2 norm (<= 0: no clipping)
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8;
  /// AdamW for every parameter, or Muon for the hidden matrices
  /// (is_muon_param) and AdamW (lr) for the rest.
  OptimizerKind optimizer = OptimizerKind::AdamW;
  double muon_lr = 0.02;       // Muon's peak learning rate (same warmup and decay as lr)
  double muon_momentum = 0.95;
  MuonLrScale muon_lr_scale = MuonLrScale::Original;
  AnchorDraw anchors = AnchorDraw::Redraw;
  int64_t save_every = 500;    // checkpoint period in steps (0: only at the end)
  int64_t eval_every = 250;    // evaluation period in steps (0: only at the end)
  int64_t log_every = 10;      // Lines mode / metrics.jsonl period
  uint64_t seed = 0;           // drafter init, data order, anchors (and the eval split unless split_seed)
  /// Seed of the held-out split and its anchors; unset = `seed`. Runs that
  /// continue one another (--init) should share it, so that none trains on
  /// another's held-out sequences and their evaluations compare.
  std::optional<uint64_t> split_seed;
  LossOptions loss;            // weights and gamma_decay
  double eval_fraction = 0.02; // share of sequences held out for evaluation
  int eval_max_sequences = 16; // cap on held-out sequences
  int eval_anchors_per_seq = 32;
  int64_t max_len = 0;         // truncate sequences to this many tokens (0: the target's context)
  // (anchors, optimizer, seed, batch, anchors_per_seq, the split and max_len
  // must not change on --resume.)
  int64_t feature_cache_mb = 0;  // keep target features of up to this many MiB in memory
  std::string feature_cache_dir;  // also keep them on disk there (DiskFeatureCache; "" = no)
  MatmulPrecision precision = MatmulPrecision::BFloat16;
  /// Where the drafter, its optimizer, the loss and the target's features
  /// are computed: "cpu", "cuda" or "cuda:N" (CUDA needs dspark built
  /// against a CUDA libtorch; see docs/training.md). Off the CPU the target
  /// runs as AtenForward (model/aten_forward.hpp) on that device, and every
  /// other product in ATen ops. Checkpoints and exports are written from
  /// CPU copies, so a run may resume on another device.
  std::string device = "cpu";
  /// Compute as off the CPU even on the CPU: the target as AtenForward and
  /// no dspark kernel in the LM-head products or the loss. Checks the device
  /// path on a machine without one (slower than the kernels).
  bool aten_only = false;
  int keep_checkpoints = 2;    // step directories kept under checkpoints/
  bool resume = false;         // continue from OUT/checkpoints/latest.json
  /// Evaluation only (`dspark train --eval-only`): every sequence of the data
  /// set with an anchor is held out (up to eval_max_sequences; 0 = all), no
  /// training split is needed, and out_dir may be empty. Used to measure a
  /// drafter's teacher-forced τ on data no run trained on (the proxy of
  /// docs/training.md). Requires init_drafter.
  bool eval_only = false;
  Progress progress = Progress::Auto;

  /// Throws InvalidArgument naming the first field out of range.
  void validate() const;
};

/// The device of cfg.device. Throws InvalidArgument for a malformed name,
/// and dspark::Error for CUDA when this build or machine has none.
at::Device train_device(const TrainConfig& cfg);

/// The init drafter `d` with n_layers draft layers (> its own): layers
/// 0..n-1 keep their parameters, the new ones are initialized as
/// Drafter::init(…, seed) would, except their output projections
/// (layers.i.attn_output.weight, layers.i.ffn_down.weight), which are zero,
/// so the new layers add nothing to the residual stream and the grown
/// drafter computes exactly what `d` computes until training moves them.
/// Throws InvalidArgument when n_layers is not above d's.
Drafter grow_drafter(const Drafter& d, int n_layers, uint64_t seed);

/// Learning rate of step `step` (0-based): linear warmup over
/// ceil(warmup·steps) steps from lr/warm to lr, then cosine decay towards 0
/// at `steps`.
double lr_at(const TrainConfig& cfg, int64_t step);

/// Figures of one optimizer step.
struct StepStats {
  int64_t step = 0;        // steps completed after this one
  double loss = 0;         // w-weighted mean total loss of the batch
  double ce = 0, l1 = 0, bce = 0, kl = 0;  // w-weighted means of each term
  double lr = 0;           // learning rate used (AdamW; Muon's is lr·muon_lr/cfg.lr)
  double grad_norm = 0;    // global norm before clipping
  int64_t anchors = 0;     // anchors in the batch
  int64_t sequences = 0;   // sequences visited
  int64_t tokens = 0;      // tokens run through the target
  double valid_slots = 0;  // supervised slots
  double seconds = 0;      // wall time of the step
  double target_seconds = 0;  // ... spent in the target forward (features)
  /// The batch: each visited sequence (data set index) and its anchors.
  struct Group {
    size_t sequence = 0;
    std::vector<int64_t> anchors;
  };
  std::vector<Group> groups;
};

/// Evaluation on the held-out split.
struct EvalStats {
  AcceptanceStats acceptance;
  double loss = 0, ce = 0, l1 = 0, bce = 0, kl = 0;  // w-weighted means
  int64_t sequences = 0;
  bool held_out = true;    // false: no sequence was held out, the training split was used
  double seconds = 0;
};

class Trainer {
 public:
  /// Loads the data set, splits it, builds (or, with cfg.resume, restores)
  /// the drafter and the optimizer. `target` must outlive the trainer.
  /// Throws dspark::Error / FormatError / InvalidArgument when the data set
  /// is unreadable, was made for another target (target_id mismatch), holds
  /// no trainable anchor, the initial drafter does not match the target, or
  /// a checkpoint to resume from is missing or inconsistent.
  Trainer(TrainConfig cfg, TargetModel& target);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// One optimizer step (see the file comment).
  StepStats step();
  /// Teacher-forced loss and acceptance on the held-out split (fixed anchors,
  /// drawn once from the seed), no gradient.
  EvalStats evaluate();
  /// Writes a checkpoint for the current step and the bf16 export in out_dir.
  void save_checkpoint();
  /// Computes the target features of every sequence with an anchor (held-out
  /// ones too: another split trains on them) not yet in the disk feature
  /// cache (cfg.feature_cache_dir) and stores them; returns the number of
  /// sequences computed. Rebuilds the cache a later run reads
  /// instead of running the target. Throws InvalidArgument without a cache
  /// directory.
  int64_t fill_feature_cache();
  /// Runs steps until cfg.steps with progress output, periodic evaluation and
  /// checkpoints, then evaluates, checkpoints and exports. Returns the last
  /// evaluation.
  EvalStats run();

  int64_t steps_done() const;
  /// Epoch of the next sequence visit (0-based; a pass over the training split each).
  int64_t epoch() const;
  const TrainConfig& config() const;
  /// The drafter being trained (parameters require gradients; call
  /// Drafter::bind before using it for inference).
  Drafter& drafter();
  /// Sequence indices of the training and held-out splits.
  const std::vector<size_t>& train_indices() const;
  const std::vector<size_t>& eval_indices() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dspark::train
