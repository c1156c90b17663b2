// dspark/train/optimizer.hpp — the trainer's optimizers: AdamW for every
// parameter, or Muon for the hidden matrices and AdamW for the rest (as
// Muon's authors use it: embeddings, output projections, norms and biases
// stay with AdamW).
//
// Muon (Keller Jordan, "Muon: An optimizer for hidden layers in neural
// networks", 2024; PyTorch's torch.optim.Muon, 2.9), per matrix P [A, B]
// with gradient G, momentum μ and learning rate η:
//   M ← μ·M + (1 − μ)·G                     (momentum buffer, M₀ = 0)
//   U ← (1 − μ)·G + μ·M  (Nesterov)  or  M
//   O ← NS₅(U)                              (Newton-Schulz, below)
//   P ← P·(1 − η·λ) − η·s(A, B)·O           (λ: decoupled weight decay)
// NS₅: X = U / max(‖U‖_F, ε), transposed when A > B; five times
//   X ← a·X + (b·XXᵀ + c·(XXᵀ)²)·X,  (a, b, c) = (3.4445, −4.7750, 2.0315),
// transposed back: an approximation of the orthogonal factor of U (its
// singular values pushed towards 1). s(A, B) is the learning-rate scale:
//   original         sqrt(max(1, A/B))           (Keller Jordan's, torch's default)
//   match-rms-adamw  0.2·sqrt(max(A, B))         (Moonlight: an update of AdamW's RMS,
//                                                 so Muon can share AdamW's lr)
// PyTorch runs NS₅ in bf16, and so does the trainer at its default bf16
// precision (muon_ns_bf16: every product's operands and result in bf16,
// fp32 sums); otherwise NS₅ runs in the parameter's dtype when that is fp64
// (the reference tests) and in fp32. Every step is an ATen op, so Muon runs
// on any device the trainer runs on. On a CPU, bf16 products run through
// oneDNN where the CPU has AVX-512 (about twice fp32's rate); elsewhere as
// fp32 products of the same bf16 operands, rounded to bf16.
//
// AdamW is libtorch's torch::optim::AdamW (decoupled weight decay, bias
// correction), bit-compatible with the optimizer state of earlier
// checkpoints.
#pragma once

#include <ATen/ATen.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <memory>
#include <string>
#include <vector>

namespace torch::optim {
class AdamW;
}

namespace dspark::train {

enum class OptimizerKind { AdamW, Muon };
std::string to_string(OptimizerKind k);
/// "adamw" | "muon"; throws InvalidArgument otherwise.
OptimizerKind parse_optimizer(const std::string& s);

enum class MuonLrScale { Original, MatchRmsAdamW };
std::string to_string(MuonLrScale s);
/// "original" | "match-rms-adamw"; throws InvalidArgument otherwise.
MuonLrScale parse_muon_lr_scale(const std::string& s);

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::AdamW;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // AdamW
  double weight_decay = 0.0;                       // decoupled, both groups
  double muon_momentum = 0.95;
  bool muon_nesterov = true;
  int muon_ns_steps = 5;
  double muon_eps = 1e-7;                          // floor of ‖U‖_F in NS₅
  bool muon_ns_bf16 = false;                       // NS₅ in bf16 for fp32 parameters
  MuonLrScale muon_lr_scale = MuonLrScale::Original;
};

/// The Newton-Schulz iteration NS₅ above for a 2-D tensor `g` [A, B]:
/// result [A, B] in g's dtype (computed in fp64 for fp64 g; else in bf16
/// products with `bf16`, in fp32 without). Throws InvalidArgument for a
/// tensor that is not 2-D.
at::Tensor newton_schulz(const at::Tensor& g, int steps = 5, double eps = 1e-7, bool bf16 = false);

/// s(A, B) above for a [rows, cols] matrix.
double muon_lr_factor(int64_t rows, int64_t cols, MuonLrScale scale);

/// Whether a drafter parameter (by name and shape) is a hidden matrix that
/// Muon updates: every 2-D parameter with at least two rows and columns
/// except the vocabulary-sized ones (markov_w1 is an embedding looked up by
/// token, markov_w2 and elman.wo project onto the vocabulary) and the
/// confidence head's output row (conf_proj).
bool is_muon_param(const std::string& name, at::IntArrayRef shape);

/// A parameter handed to Optimizer (the tensor is updated in place).
struct OptParam {
  std::string name;
  at::Tensor tensor;
  bool muon = false;  // updated by Muon (only with OptimizerKind::Muon)
};

class Optimizer {
 public:
  /// Parameters must require gradients; with kind AdamW every parameter is
  /// AdamW's whatever `muon` says. Throws InvalidArgument for a Muon
  /// parameter that is not 2-D or options out of range.
  Optimizer(std::vector<OptParam> params, OptimizerOptions opts);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// Clears every parameter's gradient.
  void zero_grad();
  /// One update: AdamW's parameters with learning rate `lr`, Muon's with
  /// `muon_lr` (times muon_lr_factor). Parameters without a gradient are
  /// left alone (and their state does not advance).
  void step(double lr, double muon_lr);

  /// The state (AdamW moments and step counts, Muon momentum buffers). With
  /// kind AdamW the archive is AdamW's own, as earlier checkpoints hold it.
  void save(torch::serialize::OutputArchive& ar) const;
  /// Restores save()'s state (copied to each parameter's device). Throws
  /// FormatError when the archive was written for another optimizer or
  /// another set of parameters.
  void load(torch::serialize::InputArchive& ar);

  const OptimizerOptions& options() const { return opts_; }
  /// Names of the parameters Muon updates (empty for AdamW).
  std::vector<std::string> muon_names() const;

 private:
  OptimizerOptions opts_;
  std::vector<OptParam> muon_;
  std::vector<at::Tensor> momentum_;  // per muon_ entry
  std::vector<at::Tensor> adam_params_;
  std::unique_ptr<torch::optim::AdamW> adam_;
};

}  // namespace dspark::train
