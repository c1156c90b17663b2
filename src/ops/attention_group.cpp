// Grouped attention passes; see attention_group.hpp.
#include "attention_group.hpp"

#include <algorithm>

namespace dspark::ops::detail {

GroupAttention::GroupAttention(int64_t max_len, int64_t hd)
    : p_(static_cast<size_t>(kMaxGroupQueries * max_len)),
      acc_(static_cast<size_t>(kMaxGroupQueries * hd)),
      max_len_(max_len),
      hd_(hd) {}

void GroupAttention::add_heads(const float* q, int64_t q_stride, float* out, int64_t n_heads, int64_t t, int64_t h0,
                               int64_t h1, int64_t L) {
  for (int64_t h = h0; h < h1; ++h, ++nq_) {
    q_[nq_] = q + t * q_stride + h * hd_;
    out_[nq_] = out + (t * n_heads + h) * hd_;
    L_[nq_] = L;
  }
}

void GroupAttention::run(const KernelTable& kt, const float* K, const float* V, int64_t r0, int64_t L1, float scale) {
  const int nq = nq_;
  nq_ = 0;
  const float* const* q = q_;
  const int64_t* L = L_;
  float* const* out = out_;
  const int64_t hd = hd_;
  float* p[kMaxGroupQueries] = {};
  float* pb[kMaxGroupQueries] = {};
  float* acc[kMaxGroupQueries] = {};
  int64_t La[kMaxGroupQueries] = {}, Lb[kMaxGroupQueries] = {};
  float inv[kMaxGroupQueries] = {};
  int64_t la_min = L1, lb_min = max_len_, lb_max = 0;
  for (int i = 0; i < nq; ++i) {
    p[i] = p_.data() + i * max_len_;
    pb[i] = p[i] + L1;
    acc[i] = acc_.data() + i * hd_;
    La[i] = std::min(L[i], L1);
    Lb[i] = L[i] - La[i];
    la_min = std::min(la_min, La[i]);
    lb_min = std::min(lb_min, Lb[i]);
    lb_max = std::max(lb_max, Lb[i]);
  }
  kt.scores(q, La, nq, K + r0 * hd, hd, scale, p);
  if (lb_max > 0) kt.scores(q, Lb, nq, K, hd, scale, pb);
  for (int i = 0; i < nq; ++i) {
    inv[i] = 1.f / kt.softmax_num(p[i], L[i]);
    std::fill(acc[i], acc[i] + hd, 0.f);
  }
  // Values in position order: the rows every query reads together, then each
  // query's own remaining rows.
  const float* Va = V + r0 * hd;
  kt.pv(p, nq, Va, 0, la_min, hd, acc);
  for (int i = 0; i < nq; ++i)
    if (La[i] > la_min) kt.pv(p + i, 1, Va, la_min, La[i], hd, acc + i);
  if (lb_max > 0) {
    kt.pv(pb, nq, V, 0, lb_min, hd, acc);
    for (int i = 0; i < nq; ++i)
      if (Lb[i] > lb_min) kt.pv(pb + i, 1, V, lb_min, Lb[i], hd, acc + i);
  }
  for (int i = 0; i < nq; ++i)
    for (int64_t d = 0; d < hd; ++d) out[i][d] = acc[i][d] * inv[i];
}

GroupShape group_shape(int64_t group, int64_t n_kv, int64_t T, bool share_positions, int64_t min_units) {
  int64_t heads = std::min<int64_t>(group, kMaxGroupQueries);
  auto shape = [&] {
    const int64_t positions = share_positions ? std::max<int64_t>(1, kMaxGroupQueries / heads) : 1;
    return GroupShape{heads, std::max<int64_t>(1, std::min(positions, T))};
  };
  auto units = [&](GroupShape s) {
    return n_kv * ((group + s.heads - 1) / s.heads) * ((T + s.positions - 1) / s.positions);
  };
  while (heads > 1 && units(shape()) < min_units) heads = (heads + 1) / 2;
  return shape();
}

}  // namespace dspark::ops::detail
