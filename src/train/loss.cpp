// Training targets, the DSpark loss and teacher-forced acceptance; see
// include/dspark/train/loss.hpp.
#include "dspark/train/loss.hpp"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>

#include "dspark/error.hpp"
#include "dspark/ops/kernels.hpp"

namespace dspark::train {

namespace {

// w_j = exp(-j / gamma_decay) as a [γ] tensor of dtype `dt`; 1 for gamma_decay 0.
at::Tensor position_weights(int64_t G, double gamma_decay, at::ScalarType dt, at::Device dev = at::kCPU) {
  if (!(gamma_decay >= 0) || !std::isfinite(gamma_decay))
    throw InvalidArgument("gamma_decay must be positive, or 0 for equal position weights");
  if (gamma_decay == 0) return at::ones({G}, at::TensorOptions().dtype(dt).device(dev));
  return at::exp(-at::arange(G, at::kDouble) / gamma_decay).to(dev, dt);
}

// VocabLossFn's {ce, l1, kl} in ATen ops, for tensors off the CPU (autograd
// gives the same gradients; |x| has gradient 0 at 0, as sign() there).
// kl is zeros unless `with_kl`.
std::vector<at::Tensor> vocab_loss_ops(const at::Tensor& logits, const at::Tensor& p_target, const at::Tensor& labels,
                                       bool with_kl) {
  const at::Tensor lse = at::logsumexp(logits, -1);
  const at::Tensor ce = lse - logits.gather(1, labels.unsqueeze(1)).squeeze(1);
  const at::Tensor logq = logits - lse.unsqueeze(1);
  const at::Tensor l1 = (at::exp(logq) - p_target).abs().sum(-1);
  const at::Tensor kl = with_kl ? (at::xlogy(p_target, p_target) - p_target * logq).sum(-1) : at::zeros_like(ce);
  return {ce, l1, kl};
}

// Per-row cross-entropy, L1 distance and forward KL of softmax(z) to p^t, fused:
//   forward   p = softmax(z), ce = logsumexp(z) − z[y], l1 = Σ_v |p_v − pt_v|,
//             kl = Σ_v pt_v (log pt_v − log p_v)   (0 unless with_kl; terms with pt_v = 0 are 0)
//   backward  ∂ce/∂z = p − onehot(y),  ∂l1/∂z = p ⊙ (s − ⟨s, p⟩), s = sign(p − pt),
//             ∂kl/∂z = p·Σ_v pt_v − pt
// z, pt: [M, V] (fp32 or fp64), y: [M] int64 → {ce [M], l1 [M], kl [M]}.
class VocabLossFn : public torch::autograd::Function<VocabLossFn> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                                                const at::Tensor& p_target, const at::Tensor& labels, bool with_kl) {
    at::Tensor z = logits.contiguous(), pt = p_target.contiguous(), y = labels.contiguous();
    const int64_t M = z.size(0), V = z.size(1);
    at::Tensor p = at::empty_like(z), ce = at::empty({M}, z.options()), l1 = at::empty({M}, z.options());
    at::Tensor kl = at::zeros({M}, z.options());
    AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "vocab_loss_forward", [&] {
      const scalar_t* zp = z.data_ptr<scalar_t>();
      const scalar_t* tp = pt.data_ptr<scalar_t>();
      const int64_t* yp = y.data_ptr<int64_t>();
      scalar_t* pp = p.data_ptr<scalar_t>();
      scalar_t* cp = ce.data_ptr<scalar_t>();
      scalar_t* lp = l1.data_ptr<scalar_t>();
      scalar_t* kp = kl.data_ptr<scalar_t>();
      at::parallel_for(0, M, 1, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const scalar_t* zr = zp + r * V;
          const scalar_t* tr = tp + r * V;
          scalar_t* pr = pp + r * V;
          scalar_t mx = zr[0];
          for (int64_t v = 1; v < V; ++v) mx = std::max(mx, zr[v]);
          double sum = 0;
          for (int64_t v = 0; v < V; ++v) {
            pr[v] = std::exp(zr[v] - mx);
            sum += pr[v];
          }
          const scalar_t inv = static_cast<scalar_t>(1.0 / sum);
          double dist = 0;
          for (int64_t v = 0; v < V; ++v) {
            pr[v] *= inv;
            dist += std::abs(pr[v] - tr[v]);
          }
          const double lse = static_cast<double>(mx) + std::log(sum);
          cp[r] = static_cast<scalar_t>(lse - static_cast<double>(zr[yp[r]]));
          lp[r] = static_cast<scalar_t>(dist);
          if (with_kl) {
            double k = 0;
            for (int64_t v = 0; v < V; ++v)
              if (tr[v] > 0)
                k += static_cast<double>(tr[v]) * (std::log(static_cast<double>(tr[v])) - (zr[v] - lse));
            kp[r] = static_cast<scalar_t>(k);
          }
        }
      });
    });
    ctx->save_for_backward({p, pt, y});
    return {ce, l1, kl};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& p = saved[0];
    const at::Tensor& pt = saved[1];
    const at::Tensor& y = saved[2];
    const int64_t M = p.size(0), V = p.size(1);
    at::Tensor gce = grads[0].defined() ? grads[0].contiguous() : at::zeros({M}, p.options());
    at::Tensor gl1 = grads[1].defined() ? grads[1].contiguous() : at::zeros({M}, p.options());
    at::Tensor gkl = grads[2].defined() ? grads[2].contiguous() : at::zeros({M}, p.options());
    at::Tensor gz = at::empty_like(p);
    AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "vocab_loss_backward", [&] {
      const scalar_t* pp = p.data_ptr<scalar_t>();
      const scalar_t* tp = pt.data_ptr<scalar_t>();
      const int64_t* yp = y.data_ptr<int64_t>();
      const scalar_t* ga = gce.data_ptr<scalar_t>();
      const scalar_t* gb = gl1.data_ptr<scalar_t>();
      const scalar_t* gk = gkl.data_ptr<scalar_t>();
      scalar_t* out = gz.data_ptr<scalar_t>();
      at::parallel_for(0, M, 1, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const scalar_t* pr = pp + r * V;
          const scalar_t* tr = tp + r * V;
          scalar_t* o = out + r * V;
          const scalar_t a = ga[r], b = gb[r], c = gk[r];
          double dot = 0, mass = 0;
          if (b != 0) {
            for (int64_t v = 0; v < V; ++v) {
              const scalar_t d = pr[v] - tr[v];
              dot += d > 0 ? pr[v] : (d < 0 ? -pr[v] : 0);
            }
          }
          if (c != 0)
            for (int64_t v = 0; v < V; ++v) mass += tr[v];
          const scalar_t dt = static_cast<scalar_t>(dot), sm = static_cast<scalar_t>(mass);
          for (int64_t v = 0; v < V; ++v) {
            const scalar_t d = pr[v] - tr[v];
            const scalar_t sg = d > 0 ? 1 : (d < 0 ? -1 : 0);
            o[v] = a * pr[v] + b * pr[v] * (sg - dt);
            if (c != 0) o[v] += c * (pr[v] * sm - tr[v]);
          }
          o[yp[r]] -= a;
        }
      });
    });
    return {gz, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

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
                              std::span<const int64_t> anchors, int gamma,
                              std::span<const TokenId> draft_vocab) {
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
  if (!draft_vocab.empty()) {
    t.draft_labels = at::full({N, G}, -1, at::kLong);
    auto dl = t.draft_labels.accessor<int64_t, 2>();
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < G; ++j) {
        if (!val[i][j]) continue;
        const auto id = static_cast<TokenId>(lab[i][j]);
        auto it = std::lower_bound(draft_vocab.begin(), draft_vocab.end(), id);
        if (it != draft_vocab.end() && *it == id) dl[i][j] = it - draft_vocab.begin();
      }
  }
  return t;
}

namespace {

void check_head(const char* what, const at::Tensor& final_hidden, const at::Tensor& lm_head) {
  if (final_hidden.dim() != 2 || lm_head.dim() != 2 || lm_head.size(1) != final_hidden.size(1))
    throw InvalidArgument(std::string(what) + ": final_hidden " + c10::str(final_hidden.sizes()) +
                          " and lm_head " + c10::str(lm_head.sizes()) + " do not match");
}

void check_positions(const char* what, const at::Tensor& target_pos, int64_t L) {
  if (target_pos.numel() > 0 && (target_pos.min().item<int64_t>() < 0 || target_pos.max().item<int64_t>() >= L))
    throw InvalidArgument(std::string(what) + ": position outside the sequence");
}

// softcap(h · lm_headᵀ) for h [M, d]: [M, V], fp32 (fp64 for fp64 h), no
// gradient. bf16 precision with fp32 h uses the target's own logits
// computation (bf16 inputs, fp32 accumulation).
at::Tensor head_logits(const at::Tensor& h, const at::Tensor& lm_head, double softcap, MatmulPrecision precision,
                       bool kernels) {
  at::Tensor logits;
  const bool bf16 = h.scalar_type() == at::kFloat && precision == MatmulPrecision::BFloat16;
  if (bf16 && (!kernels || !h.is_cpu())) {
    logits = at::matmul(h.to(at::kBFloat16), lm_head.to(at::kBFloat16).t()).to(at::kFloat);
  } else if (bf16 && lm_head.size(1) % 32 == 0) {
    at::Tensor hb = h.to(at::kBFloat16).contiguous(), wb = lm_head.to(at::kBFloat16).contiguous();
    logits = at::empty({h.size(0), wb.size(0)}, at::kFloat);
    ops::linear_bf16(reinterpret_cast<const uint16_t*>(hb.data_ptr<at::BFloat16>()), h.size(0),
                         reinterpret_cast<const uint16_t*>(wb.data_ptr<at::BFloat16>()), wb.size(0), wb.size(1),
                         logits.data_ptr<float>(), wb.size(0));
  } else {
    const auto dt = h.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    logits = at::matmul(h.to(dt), lm_head.to(dt).t());
  }
  if (softcap > 0) logits = at::tanh(logits / softcap) * softcap;
  return logits;
}

}  // namespace

at::Tensor target_probs(const at::Tensor& final_hidden, const at::Tensor& lm_head,
                        const at::Tensor& target_pos, double softcap, MatmulPrecision precision, bool kernels) {
  check_head("target_probs", final_hidden, lm_head);
  check_positions("target_probs", target_pos, final_hidden.size(0));
  c10::NoGradGuard no_grad;
  at::Tensor h = final_hidden.index_select(0, target_pos.reshape({-1}));  // [N*γ, d]
  at::Tensor logits = head_logits(h, lm_head, softcap, precision, kernels);
  auto sizes = target_pos.sizes().vec();
  sizes.push_back(lm_head.size(0));
  return at::softmax(logits, -1).view(sizes);
}

TargetLogitStats target_logit_stats(const at::Tensor& final_hidden, const at::Tensor& lm_head, double softcap,
                                    MatmulPrecision precision, bool kernels) {
  check_head("target_logit_stats", final_hidden, lm_head);
  c10::NoGradGuard no_grad;
  const int64_t L = final_hidden.size(0);
  const auto dt = final_hidden.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  TargetLogitStats st;
  st.lse = at::empty({L}, final_hidden.options().dtype(dt));
  st.argmax = at::empty({L}, final_hidden.options().dtype(at::kLong));
  // Rows per chunk: at most ~32 MiB of logits at a time.
  const int64_t chunk = std::max<int64_t>(1, (int64_t{8} << 20) / std::max<int64_t>(1, lm_head.size(0)));
  for (int64_t r0 = 0; r0 < L; r0 += chunk) {
    const int64_t n = std::min(chunk, L - r0);
    at::Tensor logits = head_logits(final_hidden.narrow(0, r0, n), lm_head, softcap, precision, kernels);
    st.lse.narrow(0, r0, n).copy_(at::logsumexp(logits, -1));
    st.argmax.narrow(0, r0, n).copy_(logits.argmax(-1));
  }
  return st;
}

at::Tensor target_probs_sub(const at::Tensor& final_hidden, const at::Tensor& head_rows, const at::Tensor& lse,
                            const at::Tensor& target_pos, double softcap, MatmulPrecision precision,
                            bool kernels) {
  check_head("target_probs_sub", final_hidden, head_rows);
  if (lse.dim() != 1 || lse.size(0) != final_hidden.size(0))
    throw InvalidArgument("target_probs_sub: lse " + c10::str(lse.sizes()) + " does not match final_hidden " +
                          c10::str(final_hidden.sizes()));
  check_positions("target_probs_sub", target_pos, final_hidden.size(0));
  c10::NoGradGuard no_grad;
  const at::Tensor pos = target_pos.reshape({-1});
  at::Tensor logits =
      head_logits(final_hidden.index_select(0, pos), head_rows, softcap, precision, kernels);  // [N*γ, V']
  at::Tensor p = at::exp(logits - lse.to(logits.scalar_type()).index_select(0, pos).unsqueeze(1));
  auto sizes = target_pos.sizes().vec();
  sizes.push_back(head_rows.size(0));
  return p.view(sizes);
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
  // With a draft vocabulary the labels are rows of it, −1 meaning "no CE term".
  const bool sub = t.draft_labels.defined();
  const at::Tensor& labels = sub ? t.draft_labels : t.labels;
  const int64_t lo = sub ? -1 : 0;
  if (labels.sizes() != t.valid.sizes() || labels.scalar_type() != at::kLong ||
      (labels.numel() > 0 && (labels.min().item<int64_t>() < lo || labels.max().item<int64_t>() >= logits.size(2))))
    throw InvalidArgument(std::string("dspark_loss: ") + (sub ? "draft_labels" : "labels") +
                          " must be int64 [N, γ] ids in [" + std::to_string(lo) + ", " +
                          std::to_string(logits.size(2)) + ")");
  at::Tensor w = t.valid.to(dt) * position_weights(G, opts.gamma_decay, dt, logits.device()).unsqueeze(0);  // [N, γ]
  LossTerms r;
  r.weight_sum = w.sum().item<double>();
  const double norm = normalizer > 0 ? normalizer : r.weight_sum;

  const int64_t M = logits.size(0) * G, V = logits.size(2);
  at::Tensor pt = p_target.to(dt).reshape({M, V}).detach();
  const at::Tensor z = logits.reshape({M, V}), y = (sub ? labels.clamp_min(0) : labels).reshape({M});
  const bool with_kl = opts.w_kl > 0;
  auto terms = opts.kernels && z.is_cpu() ? VocabLossFn::apply(z, pt, y, with_kl) : vocab_loss_ops(z, pt, y, with_kl);
  at::Tensor ce = terms[0].view({-1, G}), l1 = terms[1].view({-1, G}), kl = terms[2].view({-1, G});  // [N, γ]
  if (sub) {
    ce = ce * (labels >= 0).to(dt);
    // The target mass outside the draft vocabulary, where q = 0 (constant).
    l1 = l1 + (1.0 - pt.sum(-1)).clamp_min(0.0).view({-1, G});
  }
  r.l1_slot = l1.detach();
  r.c_star = c_star_override.defined() ? c_star_override.to(dt).detach()
                                        : (1.0 - 0.5 * r.l1_slot).clamp(0.0, 1.0);
  at::Tensor bce = at::binary_cross_entropy_with_logits(out.conf_logits, r.c_star, {}, {},
                                                        at::Reduction::None);
  at::Tensor s_ce = (ce * w).sum(), s_l1 = (l1 * w).sum(), s_bce = (bce * w).sum(), s_kl = (kl * w).sum();
  r.ce = s_ce.item<double>();
  r.l1 = s_l1.item<double>();
  r.bce = s_bce.item<double>();
  r.kl = s_kl.item<double>();
  at::Tensor sum = opts.w_ce * s_ce + opts.w_l1 * s_l1 + opts.w_bce * s_bce;
  if (with_kl) sum = sum + opts.w_kl * s_kl;
  // No valid slot: zero, still attached to the graph.
  r.total = norm > 0 ? sum / norm : sum * 0.0;
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
  c10::NoGradGuard no_grad;
  accumulate_acceptance(out, p_target.argmax(-1), at::Tensor(), t, loss, stats);
}

void accumulate_acceptance(const GraphOut& out, const at::Tensor& target_argmax, const at::Tensor& vocab_ids,
                           const SlotTargets& t, const LossTerms& loss, AcceptanceStats& stats) {
  c10::NoGradGuard no_grad;
  const int64_t N = out.logits.size(0), G = out.logits.size(1);
  if (out.logits.dim() != 3 || target_argmax.sizes() != out.logits.sizes().slice(0, 2) ||
      t.valid.sizes() != target_argmax.sizes() ||
      (vocab_ids.defined() && (vocab_ids.dim() != 1 || vocab_ids.size(0) != out.logits.size(2))))
    throw InvalidArgument("accumulate_acceptance: logits " + c10::str(out.logits.sizes()) + ", target argmax " +
                          c10::str(target_argmax.sizes()) + ", valid " + c10::str(t.valid.sizes()) +
                          " and vocab_ids " +
                          (vocab_ids.defined() ? c10::str(vocab_ids.sizes()) : std::string("(none)")) +
                          " do not match");
  at::Tensor drafted = out.logits.argmax(-1);  // [N, γ] logit rows
  if (vocab_ids.defined()) drafted = vocab_ids.to(at::kLong).index_select(0, drafted.reshape({-1})).view({N, G});
  at::Tensor match = (drafted == target_argmax.to(at::kLong)).logical_and(t.valid);  // [N, γ]
  at::Tensor c = loss.c_star.to(at::kDouble) * t.valid.to(at::kDouble);
  if (stats.reached.size() < static_cast<size_t>(G)) {
    stats.reached.resize(static_cast<size_t>(G), 0);
    stats.accepted.resize(static_cast<size_t>(G), 0);
  }
  const at::Tensor match_h = match.cpu(), c_h = c.cpu();
  auto m = match_h.accessor<bool, 2>();
  auto ca = c_h.accessor<double, 2>();
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
  stats.kl += loss.kl;
  stats.weight_sum += loss.weight_sum;
}

}  // namespace dspark::train
