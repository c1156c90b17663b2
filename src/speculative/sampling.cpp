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

namespace {
// Candidate order: descending logit, ascending id.
struct Before {
  const float* logits;
  bool operator()(TokenId a, TokenId b) const {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  }
};
}  // namespace

std::vector<TokenId> top_k_ids(const float* logits, int64_t V, int64_t k) {
  if (k < 1 || k > V)
    throw InvalidArgument("top_k_ids: k must be in [1, V = " + std::to_string(V) + "], got " + std::to_string(k));
  const Before before{logits};
  // One pass in ascending id order over a heap of the k best so far, the
  // last of them (in candidate order) on top. A later id with an equal
  // logit comes after every kept one, so only a strictly larger logit
  // displaces the last: the kept set is that of a full sort's first k.
  std::vector<TokenId> heap;
  heap.reserve(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) heap.push_back(static_cast<TokenId>(i));
  std::make_heap(heap.begin(), heap.end(), before);
  float bar = logits[heap.front()];
  for (int64_t i = k; i < V; ++i) {
    if (!(logits[i] > bar)) continue;
    std::pop_heap(heap.begin(), heap.end(), before);
    heap.back() = static_cast<TokenId>(i);
    std::push_heap(heap.begin(), heap.end(), before);
    bar = logits[heap.front()];
  }
  std::sort(heap.begin(), heap.end(), before);
  return heap;
}

Distribution process_logits(const float* logits, int64_t V, const SamplingParams& p) {
  if (p.greedy()) throw InvalidArgument("process_logits: greedy parameters have no distribution");
  for (int64_t i = 0; i < V; ++i)
    if (!(logits[i] < INFINITY)) bad_logits(i, logits[i]);
  const float inv_t = 1.f / p.temperature;
  const int64_t k = (p.top_k <= 0 || p.top_k >= V) ? V : p.top_k;
  std::vector<TokenId> ids;
  if (k < V) {
    ids = top_k_ids(logits, V, k);
  } else {
    ids.resize(static_cast<size_t>(V));
    std::iota(ids.begin(), ids.end(), 0);
    std::sort(ids.begin(), ids.end(), Before{logits});
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
