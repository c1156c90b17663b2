// dspark/speculative/drafter.hpp — the DSpark drafter: a DFlash block-diffusion
// backbone conditioned on the target's tapped hidden states (KV injection),
// a sequential head and a confidence head.
//
// Sources: DSpark (arXiv 2607.05147) Eq. 2-8; DFlash (arXiv 2602.06036).
// Notation: d = target hidden size, m = number of tapped layers, γ = block
// size (draft tokens per round), V = vocabulary, r = Markov rank.
//
// Block layout (anchor-first): the backbone input is [anchor, MASK × (γ-1)] at
// absolute positions p..p+γ-1, where p is the anchor's position; slot k
// (0-based) predicts the token at position p+k+1. Context features are the
// target's hidden states of positions 0..p-1.
//
// Parameters live in one named registry (`params`) that drives init, save,
// load and validation. Names follow the llama.cpp `dflash` tensor layout
// where one exists (see docs/checkpoint-format.md).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dspark/model/target.hpp"
#include "dspark/ops/linear.hpp"
#include "dspark/speculative/drafter_config.hpp"
#include "dspark/speculative/sampling.hpp"

namespace dspark {

/// Per-sequence drafter state: the projected, RoPE'd context K/V of every
/// draft layer. Rows are appended as the target accepts tokens and never
/// recomputed (dspark-method.md §1, "Context K/V cache").
struct DraftState {
  std::vector<at::Tensor> k, v;  // per layer [n_kv, cap, hd] (compute dtype)
  int64_t n_ctx = 0;             // context positions held (0..n_ctx-1)
};

/// What one drafting pass proposes.
struct Draft {
  std::vector<TokenId> tokens;          // [γ] x_1..x_γ
  std::vector<float> conf_logits;       // [γ] raw confidence logits z_k
  std::vector<Distribution> q;          // [γ] draw distributions (sampling only)
};

/// What the speculative loop needs from a drafter. Implemented by Drafter;
/// tests implement oracle drafters (perfect, always wrong, noisy) with it.
class DraftModel {
 public:
  virtual ~DraftModel() = default;
  /// Default block size γ.
  virtual int gamma() const = 0;
  /// Target layers whose outputs the drafter consumes (TapRequest::layers).
  virtual const std::vector<int>& tap_layers() const = 0;
  /// Throws InvalidArgument when the drafter was built for another target.
  virtual void check_target(const TargetInfo& target) const = 0;
  /// Calibrated per-position confidence thresholds (empty = none).
  virtual std::vector<double> calibrated_thresholds() const = 0;
  /// Calibrated STS temperatures per position (empty = none: T = 1).
  virtual std::vector<double> calibrated_temperatures() const { return {}; }
  /// Appends target features [n, m*d] of the next n context positions.
  virtual void append_context(DraftState& st, const at::Tensor& feats) const = 0;
  /// Proposes `gamma` tokens after `anchor` (at position st.n_ctx).
  virtual Draft draft(const DraftState& st, TokenId anchor, int gamma,
                      const SamplingParams& sampling, Rng& rng) const = 0;
};

class Drafter : public DraftModel {
 public:
  /// A drafter with freshly initialized parameters (seeded; deterministic).
  /// Shared parameters are created first, then head-specific ones, so the
  /// shared part is identical for every head type given the same seed.
  static Drafter init(const DrafterConfig& cfg, uint64_t seed);

  /// Wraps existing parameters; validates names and shapes against the
  /// config (throws FormatError listing the offending tensor).
  Drafter(DrafterConfig cfg, std::map<std::string, at::Tensor> params);

  const DrafterConfig& config() const { return cfg_; }
  /// Trainable parameters by name (fp32 master copies).
  const std::map<std::string, at::Tensor>& params() const { return params_; }
  std::map<std::string, at::Tensor>& mutable_params() { return params_; }
  /// The expected parameter names and shapes for `cfg` (the one registry).
  static std::vector<std::pair<std::string, std::vector<int64_t>>> param_spec(const DrafterConfig& cfg);

  /// Binds the target whose embedding and LM head the drafter shares (read
  /// through TargetModel::embed and head_logits, so the family's embedding
  /// scale and logit softcap apply, on the target's quantized or bf16
  /// weights) and prepares the drafter's matrices for the kernels: bf16
  /// copies, or with `quantize` Q8_0 ones (ops::Linear::from_tensor_q8_0;
  /// half the bytes and the int8 kernels, what the CLI uses when the target
  /// computes on quantized blocks). The target must outlive the drafter's
  /// use. Throws InvalidArgument on a dim mismatch.
  void bind(const TargetModel& target, bool quantize = false);

  int gamma() const override { return cfg_.gamma; }
  const std::vector<int>& tap_layers() const override { return cfg_.tap_layers; }
  void check_target(const TargetInfo& target) const override;
  std::vector<double> calibrated_thresholds() const override { return cfg_.sts_thresholds; }
  std::vector<double> calibrated_temperatures() const override { return cfg_.sts_temperatures; }

  /// Appends target features of new context positions: feats [n, m*d] fp32
  /// (the TapRequest output of layers cfg.tap_layers).
  void append_context(DraftState& st, const at::Tensor& feats) const override;

  /// Drafts `gamma` tokens (0 = the configured γ) after `anchor` at position
  /// st.n_ctx. Greedy when `sampling` is greedy, otherwise samples each x_k
  /// from the processed distribution q_k (kept in the result). Requires
  /// bind(). Overwrites the scratch rows of `st` past n_ctx.
  Draft draft(const DraftState& st, TokenId anchor, int gamma, const SamplingParams& sampling,
              Rng& rng) const override;

  /// Backbone hidden states of a block of `gamma` slots: [γ, d] fp32, post
  /// final norm. Used by draft() and by tests.
  at::Tensor block_hidden(const DraftState& st, TokenId anchor, int gamma) const;

 private:
  const at::Tensor& w(const std::string& name) const;     // fp32 vectors, W1 (bf16)
  const ops::Linear& lin(const std::string& name) const;  // matrices (bf16), fused ones too
  DrafterConfig cfg_;
  std::map<std::string, at::Tensor> params_;
  /// Columns per chunk of the rank-r output factors ("NAME.t", [C, r, kRankChunk]).
  static constexpr int64_t kRankChunk = 1024;
  std::map<std::string, at::Tensor> infer_;   // vectors, the Markov embedding and fp32 [C, r, kRankChunk] output factors ("NAME.t") after bind()
  std::map<std::string, ops::Linear> lin_;    // matrices after bind()
  const TargetModel* target_ = nullptr;       // embedding and LM head (bind())
  ops::Linear head_;                          // the target's LM head rows: all, or the draft vocabulary
  std::vector<TokenId> vocab_ids_;           // draft-vocab row -> token id (empty: identity)
  bool bound_ = false;
};

}  // namespace dspark
