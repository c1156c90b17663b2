// Training targets, the DSpark loss and teacher-forced acceptance; see
// include/dspark/train/loss.hpp.
#include "dspark/train/loss.hpp"

#include <algorithm>
#include <cmath>

#include "dspark/error.hpp"

namespace dspark::train {

namespace {

// w_j = exp(-j / gamma_decay) as a [γ] tensor of dtype `dt`.
at::Tensor position_weights(int64_t G, double gamma_decay, at::ScalarType dt) {
  if (!(gamma_decay > 0)) throw InvalidArgument("gamma_decay must be positive");
  return at::exp(-at::arange(G, at::kDouble) / gamma_decay).to(dt);
}

}  // namespace

std::vector<int64_t> eligible_anchors(std::span<const uint8_t> loss_mask) {
  std::vector<int64_t> out;
  const int64_t L = static_cast<int64_t>(loss_mask.size());
  for (int64_t p = 1; p + 1 < L; ++p)
    if (loss_mask[p] && loss_mask[p + 1]) out.push_back(p);
  return out;
}

std::vector<int64_t> sample_anchors(std::span<const uint8_t> loss_mask, int max_anchors,
                                    std::mt19937_64& rng) {
  std::vector<int64_t> all = eligible_anchors(loss_mask);
  const size_t k = static_cast<size_t>(std::max(0, max_anchors));
  if (all.size() > k) {
    // Partial Fisher-Yates with explicit modular draws (reproducible across
    // standard libraries, unlike std::uniform_int_distribution).
    for (size_t i = 0; i < k; ++i) {
      const size_t j = i + static_cast<size_t>(rng() % (all.size() - i));
      std::swap(all[i], all[j]);
    }
    all.resize(k);
    std::sort(all.begin(), all.end());
  }
  return all;
}

SlotTargets make_slot_targets(std::span<const TokenId> tokens, std::span<const uint8_t> loss_mask,
                              std::span<const int64_t> anchors, int gamma) {
  const int64_t L = static_cast<int64_t>(tokens.size());
  if (static_cast<int64_t>(loss_mask.size()) != L)
    throw InvalidArgument("slot targets: " + std::to_string(L) + " tokens but " +
                          std::to_string(loss_mask.size()) + " loss-mask entries");
  if (gamma < 1 || gamma > kMaxGamma)
    throw InvalidArgument("slot targets: gamma must be in [1, " + std::to_string(kMaxGamma) + "]");
  const int64_t N = static_cast<int64_t>(anchors.size()), G = gamma;
  SlotTargets t;
  t.anchors = at::empty({N}, at::kLong);
  t.prev_tokens = at::zeros({N, G}, at::kLong);
  t.labels = at::zeros({N, G}, at::kLong);
  t.target_pos = at::empty({N, G}, at::kLong);
  t.valid = at::zeros({N, G}, at::kBool);
  auto a = t.anchors.accessor<int64_t, 1>();
  auto prev = t.prev_tokens.accessor<int64_t, 2>();
  auto lab = t.labels.accessor<int64_t, 2>();
  auto pos = t.target_pos.accessor<int64_t, 2>();
  auto val = t.valid.accessor<bool, 2>();
  for (int64_t i = 0; i < N; ++i) {
    const int64_t p = anchors[i];
    if (p < 0 || p >= L)
      throw InvalidArgument("slot targets: anchor " + std::to_string(p) + " outside [0, " +
                            std::to_string(L) + ")");
    a[i] = p;
    bool ok = true;
    for (int64_t j = 0; j < G; ++j) {
      if (p + j < L) prev[i][j] = tokens[p + j];
      pos[i][j] = std::min(p + j, L - 1);
      ok = ok && p + 1 + j < L && loss_mask[p + 1 + j] != 0;
      val[i][j] = ok;
      if (ok) lab[i][j] = tokens[p + 1 + j];
    }
  }
  return t;
}

at::Tensor target_probs(const at::Tensor& final_hidden, const at::Tensor& lm_head,
                        const at::Tensor& target_pos, double softcap, MatmulPrecision precision) {
  if (final_hidden.dim() != 2 || lm_head.dim() != 2 || lm_head.size(1) != final_hidden.size(1))
    throw InvalidArgument("target_probs: final_hidden " + c10::str(final_hidden.sizes()) +
                          " and lm_head " + c10::str(lm_head.sizes()) + " do not match");
  if (target_pos.numel() > 0 &&
      (target_pos.min().item<int64_t>() < 0 || target_pos.max().item<int64_t>() >= final_hidden.size(0)))
    throw InvalidArgument("target_probs: position outside the sequence");
  at::NoGradGuard no_grad;
  at::Tensor h = final_hidden.index_select(0, target_pos.reshape({-1}));  // [N*γ, d]
  at::Tensor logits;
  if (h.scalar_type() == at::kFloat && precision == MatmulPrecision::BFloat16) {
    logits = at::matmul(h.to(at::kBFloat16), lm_head.to(at::kBFloat16).t()).to(at::kFloat);
  } else {
    const auto dt = h.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    logits = at::matmul(h.to(dt), lm_head.to(dt).t());
  }
  if (softcap > 0) logits = at::tanh(logits / softcap) * softcap;
  auto sizes = target_pos.sizes().vec();
  sizes.push_back(lm_head.size(0));
  return at::softmax(logits, -1).view(sizes);
}

double slot_weight_sum(const at::Tensor& valid, double gamma_decay) {
  at::Tensor w = position_weights(valid.size(1), gamma_decay, at::kDouble);
  return (valid.to(at::kDouble) * w).sum().item<double>();
}

LossTerms dspark_loss(const GraphOut& out, const at::Tensor& p_target, const SlotTargets& t,
                      const LossOptions& opts, double normalizer, const at::Tensor& c_star_override) {
  const at::Tensor& logits = out.logits;  // [N, γ, V]
  if (logits.dim() != 3 || p_target.sizes() != logits.sizes() || t.valid.sizes() != logits.sizes().slice(0, 2) ||
      out.conf_logits.sizes() != t.valid.sizes())
    throw InvalidArgument("dspark_loss: logits " + c10::str(logits.sizes()) + ", target " +
                          c10::str(p_target.sizes()) + ", valid " + c10::str(t.valid.sizes()) +
                          " and confidence " + c10::str(out.conf_logits.sizes()) + " do not match");
  const auto dt = logits.scalar_type();
  const int64_t G = logits.size(1);
  at::Tensor w = t.valid.to(dt) * position_weights(G, opts.gamma_decay, dt).unsqueeze(0);  // [N, γ]
  LossTerms r;
  r.weight_sum = w.sum().item<double>();
  const double norm = normalizer > 0 ? normalizer : r.weight_sum;

  at::Tensor logp = at::log_softmax(logits, -1);
  at::Tensor ce = -logp.gather(-1, t.labels.unsqueeze(-1)).squeeze(-1);  // [N, γ]
  at::Tensor l1 = (logp.exp() - p_target.to(dt)).abs().sum(-1);         // [N, γ]
  r.l1_slot = l1.detach();
  r.c_star = c_star_override.defined() ? c_star_override.to(dt).detach()
                                        : (1.0 - 0.5 * r.l1_slot).clamp(0.0, 1.0);
  at::Tensor bce = at::binary_cross_entropy_with_logits(out.conf_logits, r.c_star, {}, {},
                                                        at::Reduction::None);
  at::Tensor s_ce = (ce * w).sum(), s_l1 = (l1 * w).sum(), s_bce = (bce * w).sum();
  r.ce = s_ce.item<double>();
  r.l1 = s_l1.item<double>();
  r.bce = s_bce.item<double>();
  if (norm > 0) {
    r.total = (opts.w_ce * s_ce + opts.w_l1 * s_l1 + opts.w_bce * s_bce) / norm;
  } else {
    r.total = (s_ce + s_l1 + s_bce) * 0.0;  // no valid slot: zero, still attached to the graph
  }
  return r;
}

std::vector<double> AcceptanceStats::acceptance_by_position() const {
  std::vector<double> out(reached.size(), 0.0);
  for (size_t k = 0; k < reached.size(); ++k)
    out[k] = reached[k] ? static_cast<double>(accepted[k]) / static_cast<double>(reached[k]) : 0.0;
  return out;
}

void accumulate_acceptance(const GraphOut& out, const at::Tensor& p_target, const SlotTargets& t,
                           const LossTerms& loss, AcceptanceStats& stats) {
  at::NoGradGuard no_grad;
  const int64_t N = out.logits.size(0), G = out.logits.size(1);
  at::Tensor match = (out.logits.argmax(-1) == p_target.argmax(-1)).logical_and(t.valid);  // [N, γ]
  at::Tensor c = loss.c_star.to(at::kDouble) * t.valid.to(at::kDouble);
  if (stats.reached.size() < static_cast<size_t>(G)) {
    stats.reached.resize(static_cast<size_t>(G), 0);
    stats.accepted.resize(static_cast<size_t>(G), 0);
  }
  auto m = match.accessor<bool, 2>();
  auto ca = c.accessor<double, 2>();
  for (int64_t i = 0; i < N; ++i) {
    double surv = 1.0;
    double tau_s = 1.0;
    bool alive = true;
    double tau_g = 1.0;
    for (int64_t k = 0; k < G; ++k) {
      surv *= ca[i][k];
      tau_s += surv;
      if (alive) {
        ++stats.reached[k];
        if (m[i][k]) {
          ++stats.accepted[k];
          tau_g += 1.0;
        } else {
          alive = false;
        }
      }
    }
    stats.tau_greedy += tau_g;
    stats.tau_sample += tau_s;
  }
  stats.anchors += N;
  stats.ce += loss.ce;
  stats.l1 += loss.l1;
  stats.bce += loss.bce;
  stats.weight_sum += loss.weight_sum;
}

}  // namespace dspark::train
