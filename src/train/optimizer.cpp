// The trainer's optimizers (AdamW, Muon + AdamW); see
// include/dspark/train/optimizer.hpp.
#include "dspark/train/optimizer.hpp"

#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>

#include "bf16_matmul.hpp"
#include "dspark/error.hpp"

namespace dspark::train {

namespace {

// Keller Jordan's quintic coefficients (torch.optim.Muon's defaults).
constexpr double kNsA = 3.4445, kNsB = -4.7750, kNsC = 2.0315;
constexpr const char* kMuonFormat = "dspark-muon-v1";

}  // namespace

std::string to_string(OptimizerKind k) { return k == OptimizerKind::Muon ? "muon" : "adamw"; }

OptimizerKind parse_optimizer(const std::string& s) {
  if (s == "adamw") return OptimizerKind::AdamW;
  if (s == "muon") return OptimizerKind::Muon;
  throw InvalidArgument("unknown optimizer '" + s + "' (expected adamw or muon)");
}

std::string to_string(MuonLrScale s) { return s == MuonLrScale::MatchRmsAdamW ? "match-rms-adamw" : "original"; }

MuonLrScale parse_muon_lr_scale(const std::string& s) {
  if (s == "original") return MuonLrScale::Original;
  if (s == "match-rms-adamw") return MuonLrScale::MatchRmsAdamW;
  throw InvalidArgument("unknown Muon learning-rate scale '" + s + "' (expected original or match-rms-adamw)");
}

at::Tensor newton_schulz(const at::Tensor& g, int steps, double eps, bool bf16) {
  if (g.dim() != 2) throw InvalidArgument("newton_schulz: expected a 2-D tensor, got " + c10::str(g.sizes()));
  const bool tall = g.size(0) > g.size(1);
  const auto dt = g.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor x = tall ? g.t().to(dt) : g.to(dt);
  x = x / at::clamp_min(x.norm(), eps);
  const bool in_bf16 = bf16 && dt == at::kFloat;
  if (in_bf16) x = x.to(at::kBFloat16);
  auto mm = [in_bf16](const at::Tensor& a, const at::Tensor& b) {
    return in_bf16 ? detail::matmul_bf16(a, b) : at::matmul(a, b);
  };
  auto addmm = [in_bf16](const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double beta, double alpha) {
    return in_bf16 ? detail::addmm_bf16(c, a, b, beta, alpha) : at::addmm(c, a, b, beta, alpha);
  };
  for (int i = 0; i < steps; ++i) {
    const at::Tensor a = mm(x, x.t());
    const at::Tensor b = addmm(a, a, a, /*beta=*/kNsB, /*alpha=*/kNsC);
    x = addmm(x, b, x, /*beta=*/kNsA, /*alpha=*/1.0);
  }
  if (tall) x = x.t();
  return x.to(g.scalar_type()).contiguous();
}

double muon_lr_factor(int64_t rows, int64_t cols, MuonLrScale scale) {
  const double a = static_cast<double>(rows), b = static_cast<double>(cols);
  if (scale == MuonLrScale::MatchRmsAdamW) return 0.2 * std::sqrt(std::max(a, b));
  return std::sqrt(std::max(1.0, a / b));
}

bool is_muon_param(const std::string& name, at::IntArrayRef shape) {
  if (shape.size() != 2 || shape[0] < 2 || shape[1] < 2) return false;
  for (const char* skip : {"markov_w1.weight", "markov_w2.weight", "elman.wo", "conf_proj.weight"})
    if (name == skip) return false;
  return true;
}

Optimizer::Optimizer(std::vector<OptParam> params, OptimizerOptions opts) : opts_(opts) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw InvalidArgument("optimizer: " + what);
  };
  need(opts_.beta1 >= 0 && opts_.beta1 < 1 && opts_.beta2 >= 0 && opts_.beta2 < 1, "AdamW betas must be in [0, 1)");
  need(opts_.eps > 0 && opts_.weight_decay >= 0, "eps must be positive and weight decay >= 0");
  need(opts_.muon_momentum >= 0 && opts_.muon_momentum < 1, "Muon momentum must be in [0, 1)");
  need(opts_.muon_ns_steps >= 1 && opts_.muon_eps > 0, "Muon needs >= 1 Newton-Schulz step and a positive eps");
  for (auto& p : params) {
    if (opts_.kind == OptimizerKind::Muon && p.muon) {
      need(p.tensor.dim() == 2, "Muon parameter '" + p.name + "' is not a matrix: " + c10::str(p.tensor.sizes()));
      momentum_.push_back(at::zeros_like(p.tensor).detach());
      muon_.push_back(std::move(p));
    } else {
      adam_params_.push_back(p.tensor);
    }
  }
  if (!adam_params_.empty())
    adam_ = std::make_unique<torch::optim::AdamW>(adam_params_, torch::optim::AdamWOptions(1e-3)
                                                                    .betas({opts_.beta1, opts_.beta2})
                                                                    .eps(opts_.eps)
                                                                    .weight_decay(opts_.weight_decay));
}

Optimizer::~Optimizer() = default;

void Optimizer::zero_grad() {
  if (adam_) adam_->zero_grad();
  for (auto& p : muon_) {
    at::Tensor& g = p.tensor.mutable_grad();
    if (g.defined()) {
      g = g.detach();
      g.zero_();
    }
  }
}

void Optimizer::step(double lr, double muon_lr) {
  if (adam_) {
    for (auto& group : adam_->param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    adam_->step();
  }
  c10::NoGradGuard no_grad;
  const double mu = opts_.muon_momentum;
  for (size_t i = 0; i < muon_.size(); ++i) {
    at::Tensor& p = muon_[i].tensor;
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    at::Tensor& m = momentum_[i];
    m.lerp_(g, 1.0 - mu);
    const at::Tensor u = opts_.muon_nesterov ? g.lerp(m, mu) : m;
    const at::Tensor o = newton_schulz(u, opts_.muon_ns_steps, opts_.muon_eps, opts_.muon_ns_bf16);
    if (opts_.weight_decay > 0) p.mul_(1.0 - muon_lr * opts_.weight_decay);
    p.add_(o, -muon_lr * muon_lr_factor(p.size(0), p.size(1), opts_.muon_lr_scale));
  }
}

void Optimizer::save(torch::serialize::OutputArchive& ar) const {
  if (opts_.kind == OptimizerKind::AdamW) {
    if (adam_) adam_->save(ar);
    return;
  }
  ar.write("format", c10::IValue(std::string(kMuonFormat)));
  ar.write("muon_count", c10::IValue(static_cast<int64_t>(muon_.size())));
  for (size_t i = 0; i < muon_.size(); ++i) {
    ar.write("muon_name." + std::to_string(i), c10::IValue(muon_[i].name));
    ar.write("muon_momentum." + std::to_string(i), momentum_[i], /*is_buffer=*/true);
  }
  if (adam_) {
    torch::serialize::OutputArchive sub(ar.compilation_unit());
    adam_->save(sub);
    ar.write("adamw", sub);
  }
}

void Optimizer::load(torch::serialize::InputArchive& ar) {
  c10::IValue format;
  const bool muon_archive = ar.try_read("format", format) && format.isString() &&
                            format.toStringRef() == kMuonFormat;
  const std::string want = to_string(opts_.kind), got = muon_archive ? "muon" : "adamw";
  if (want != got)
    throw FormatError("optimizer state: written by " + got + ", this run uses " + want +
                      " (resume with the optimizer the run started with)");
  if (opts_.kind == OptimizerKind::AdamW) {
    if (adam_) adam_->load(ar);
    return;
  }
  c10::IValue count;
  ar.read("muon_count", count);
  if (!count.isInt() || count.toInt() != static_cast<int64_t>(muon_.size()))
    throw FormatError("optimizer state: holds " + (count.isInt() ? std::to_string(count.toInt()) : std::string("?")) +
                      " Muon matrices, this run has " + std::to_string(muon_.size()));
  for (size_t i = 0; i < muon_.size(); ++i) {
    c10::IValue name;
    ar.read("muon_name." + std::to_string(i), name);
    if (!name.isString() || name.toStringRef() != muon_[i].name)
      throw FormatError("optimizer state: Muon matrix " + std::to_string(i) + " is '" +
                        (name.isString() ? name.toStringRef() : std::string("?")) + "', expected '" +
                        muon_[i].name + "'");
    at::Tensor t;
    ar.read("muon_momentum." + std::to_string(i), t, /*is_buffer=*/true);
    if (t.sizes() != momentum_[i].sizes())
      throw FormatError("optimizer state: momentum of '" + muon_[i].name + "' has shape " + c10::str(t.sizes()) +
                        ", expected " + c10::str(momentum_[i].sizes()));
    momentum_[i].copy_(t);
  }
  if (adam_) {
    torch::serialize::InputArchive sub;
    ar.read("adamw", sub);
    adam_->load(sub);
  }
}

std::vector<std::string> Optimizer::muon_names() const {
  std::vector<std::string> out;
  for (const auto& p : muon_) out.push_back(p.name);
  return out;
}

}  // namespace dspark::train
