// Verification rules of speculative sampling (Leviathan et al. 2023; Chen et
// al. 2023) and confidence pruning (DSpark §3.2, Alg. 1 with R = 1).
#include <algorithm>
#include <cmath>
#include <map>

#include "dspark/speculative/speculative.hpp"

namespace dspark {

int prune_length(const std::vector<float>& conf_logits, const std::vector<double>& thresholds) {
  const int n = static_cast<int>(conf_logits.size());
  for (int k = 1; k < n && k < static_cast<int>(thresholds.size()); ++k) {
    const double c = 1.0 / (1.0 + std::exp(-static_cast<double>(conf_logits[k])));
    if (c < thresholds[k]) return k;
  }
  return n;
}

int prune_length(const std::vector<float>& conf_logits, const std::vector<double>& thresholds,
                 const std::vector<double>& temperatures) {
  if (temperatures.empty()) return prune_length(conf_logits, thresholds);
  const int n = static_cast<int>(conf_logits.size());
  double survival = 1.0;
  for (int k = 0; k < n; ++k) {
    const double t = k < static_cast<int>(temperatures.size()) ? temperatures[k] : 1.0;
    survival *= 1.0 / (1.0 + std::exp(-static_cast<double>(conf_logits[k]) / t));
    if (k >= 1 && k < static_cast<int>(thresholds.size()) && survival < thresholds[k]) return k;
  }
  return n;
}

namespace {

// A draft distribution is usable only when every probability is a finite
// non-negative number. A drafter with diverged weights yields NaN logits and
// so NaN probabilities; its token was then not drawn from any distribution
// the acceptance rule can reason about, so it is rejected and the
// correction is drawn from p itself (see residual), which keeps the output
// distributed exactly as p.
bool usable(const Distribution& q) {
  for (float v : q.probs)
    if (!(v >= 0.f) || !std::isfinite(v)) return false;
  return !q.probs.empty();
}

}  // namespace

double accept_probability(const Distribution& p, const Distribution& q, TokenId x) {
  if (!usable(q)) return 0.0;
  const double px = p.prob(x);
  const double qx = std::max(static_cast<double>(q.prob(x)), 1e-8);
  return std::min(1.0, px / qx);
}

bool accept_token(const Distribution& p, const Distribution& q, TokenId x, double u) {
  return u < accept_probability(p, q, x);
}

Distribution residual(const Distribution& p, const Distribution& q) {
  if (!usable(q)) return p;
  std::map<TokenId, double> r;
  double mass = 0.0;
  for (size_t i = 0; i < p.ids.size(); ++i) {
    const double v = static_cast<double>(p.probs[i]) - q.prob(p.ids[i]);
    if (v > 0) {
      r[p.ids[i]] = v;
      mass += v;
    }
  }
  if (mass < 1e-9) return p;
  std::vector<std::pair<TokenId, double>> items(r.begin(), r.end());
  std::stable_sort(items.begin(), items.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  Distribution d;
  for (const auto& [id, v] : items) {
    d.ids.push_back(id);
    d.probs.push_back(static_cast<float>(v / mass));
  }
  return d;
}

}  // namespace dspark
