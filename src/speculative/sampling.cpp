// Logits processing and sampling; see include/dspark/speculative/sampling.hpp.
#include "dspark/speculative/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>
#include <string>

#include "dspark/error.hpp"
#include "dspark/speculative/seed_stable.hpp"

namespace dspark {

namespace {
std::string fmt(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
}  // namespace

const char* to_string(SamplingRule r) { return r == SamplingRule::SeedStable ? "seed-stable" : "rejection"; }

void SamplingParams::validate() const {
  if (!std::isfinite(temperature) || temperature < 0.f)
    throw InvalidArgument("temperature must be a finite number >= 0, got " + fmt(temperature));
  if (!(top_p > 0.f && top_p <= 1.f))
    throw InvalidArgument("top_p must be in (0, 1], got " + fmt(top_p));
  if (!(min_p >= 0.f && min_p <= 1.f))
    throw InvalidArgument("min_p must be in [0, 1], got " + fmt(min_p));
  if (top_k < 0) throw InvalidArgument("top_k must be >= 0, got " + std::to_string(top_k));
}

float Distribution::prob(TokenId id) const {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == id) return probs[i];
  return 0.f;
}

namespace {
// NaN or +inf logits come from corrupt or overflowing weights; decoding
// them would print garbage with a success status.
[[noreturn]] void bad_logits(int64_t i, float v) {
  throw Error("the model produced " + std::string(std::isnan(v) ? "a NaN" : "an infinite") + " logit (token " +
              std::to_string(i) + "): its weights are corrupt or overflow");
}
}  // namespace

TokenId argmax(const float* logits, int64_t V) {
  int64_t best = 0;
  bool bad = !(logits[0] < INFINITY);
  for (int64_t i = 1; i < V; ++i) {
    bad |= !(logits[i] < INFINITY);  // NaN or +inf
    if (logits[i] > logits[best]) best = i;
  }
  if (bad)
    for (int64_t i = 0; i < V; ++i)
      if (!(logits[i] < INFINITY)) bad_logits(i, logits[i]);
  return static_cast<TokenId>(best);
}

Distribution process_logits(const float* logits, int64_t V, const SamplingParams& p) {
  if (p.greedy()) throw InvalidArgument("process_logits: greedy parameters have no distribution");
  for (int64_t i = 0; i < V; ++i)
    if (!(logits[i] < INFINITY)) bad_logits(i, logits[i]);
  const float inv_t = 1.f / p.temperature;
  // Candidate order: descending logit, ascending id.
  auto before = [&](TokenId a, TokenId b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  const int64_t k = (p.top_k <= 0 || p.top_k >= V) ? V : p.top_k;
  std::vector<TokenId> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  if (k < V) {
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), before);
    ids.resize(static_cast<size_t>(k));
  } else {
    std::sort(ids.begin(), ids.end(), before);
  }
  // Softmax of the scaled logits over the kept candidates.
  const float mx = logits[ids[0]] * inv_t;
  std::vector<double> e(ids.size());
  double sum = 0.0;
  for (size_t i = 0; i < ids.size(); ++i) {
    e[i] = std::exp(static_cast<double>(logits[ids[i]] * inv_t - mx));
    sum += e[i];
  }
  size_t keep = ids.size();
  if (p.top_p < 1.f) {
    double cum = 0.0;
    for (size_t i = 0; i < ids.size(); ++i) {
      cum += e[i] / sum;
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.f) {
    const double floor = static_cast<double>(p.min_p) * e[0];
    size_t i = 1;
    while (i < keep && e[i] >= floor) ++i;
    keep = i;
  }
  Distribution d;
  d.ids.assign(ids.begin(), ids.begin() + static_cast<int64_t>(keep));
  d.probs.resize(keep);
  double kept = 0.0;
  for (size_t i = 0; i < keep; ++i) kept += e[i];
  for (size_t i = 0; i < keep; ++i) d.probs[i] = static_cast<float>(e[i] / kept);
  return d;
}

TokenId sample(const Distribution& dist, Rng& rng) {
  const double u = rng.uniform();
  double cum = 0.0;
  for (size_t i = 0; i < dist.ids.size(); ++i) {
    cum += dist.probs[i];
    if (u < cum) return dist.ids[i];
  }
  return dist.ids.back();  // rounding left u just above the total mass
}

}  // namespace dspark

namespace dspark {

TokenId draw(const Distribution& dist, const SamplingParams& params, Rng& rng, int64_t position) {
  return params.rule == SamplingRule::SeedStable ? gumbel_argmax(dist, params.seed, position) : sample(dist, rng);
}

}  // namespace dspark
