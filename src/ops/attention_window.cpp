// Sliding-window attention over a ring-buffer cache; see
// include/dspark/ops/attention_window.hpp. The keys of a query are one or two
// contiguous runs of ring rows (before and after the wrap), visited in
// position order with the active level's attention kernels.
#include "dspark/ops/attention_window.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "kernel_table.hpp"

namespace dspark::ops {

void attention_window(const float* q, int64_t q_stride, const float* K, const float* V, int64_t cap,
                      int64_t n_past, int64_t T, int64_t n_heads, int64_t n_kv, int64_t hd, int64_t window,
                      float scale, float* out) {
  if (hd % 16 != 0 || window < 1)
    throw InvalidArgument("attention_window: head dim " + std::to_string(hd) + " must be a multiple of 16 and window " +
                          std::to_string(window) + " positive");
  const int64_t span = std::min(n_past + T, window + T - 1);
  if (cap < span)
    throw InvalidArgument("attention_window: a ring of " + std::to_string(cap) + " rows cannot hold the " +
                          std::to_string(span) + " positions this call reads");
  if (T == 0) return;
  const auto& kt = detail::active_kernels();
  const int64_t group = n_heads / n_kv;
  const int64_t L_max = std::min(window, n_past + T);
  at::parallel_for(0, T * n_heads, std::max<int64_t>(1, 65536 / std::max<int64_t>(L_max * hd * 2, 1)),
                   [&](int64_t i0, int64_t i1) {
    std::vector<float> p(static_cast<size_t>(L_max)), acc(static_cast<size_t>(hd));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / n_heads, h = i % n_heads, g = h / group;
      const int64_t pos = n_past + t, j0 = std::max<int64_t>(0, pos - window + 1), L = pos - j0 + 1;
      const float* qv = q + t * q_stride + h * hd;
      const float* Kg = K + g * cap * hd;
      const float* Vg = V + g * cap * hd;
      // Positions j0 .. j0 + L - 1 live in rows r0 .. cap - 1, then 0 .. (wrapped).
      const int64_t r0 = j0 % cap, L1 = std::min(L, cap - r0), L2 = L - L1;
      kt.scores(qv, Kg + r0 * hd, L1, hd, scale, p.data());
      if (L2 > 0) kt.scores(qv, Kg, L2, hd, scale, p.data() + L1);
      const float inv = 1.f / kt.softmax_num(p.data(), L);
      std::fill(acc.begin(), acc.end(), 0.f);
      kt.pv(p.data(), Vg + r0 * hd, L1, hd, acc.data());
      if (L2 > 0) kt.pv(p.data() + L1, Vg, L2, hd, acc.data());
      float* o = out + t * n_heads * hd + h * hd;
      for (int64_t d = 0; d < hd; ++d) o[d] = acc[d] * inv;
    }
  });
}

}  // namespace dspark::ops
