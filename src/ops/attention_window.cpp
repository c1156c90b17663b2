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
#include "attention_group.hpp"
#include "kernel_table.hpp"
#include "parallel.hpp"

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
  // Passes over one KV group's keys: a block of its heads at one position
  // (every head of a position reads the same window).
  const auto gs = detail::group_shape(group, n_kv, T, false, 2 * at::get_num_threads());
  const int64_t hblocks = (group + gs.heads - 1) / gs.heads;
  detail::parallel_tasks(0, n_kv * hblocks * T, 1, [&](int64_t u0, int64_t u1) {
    detail::GroupAttention pass(L_max, hd);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t g = u / (hblocks * T), hb = (u / T) % hblocks, t = u % T;
      const int64_t pos = n_past + t, j0 = std::max<int64_t>(0, pos - window + 1), L = pos - j0 + 1;
      const int64_t h0 = g * group + hb * gs.heads;
      pass.add_heads(q, q_stride, out, n_heads, t, h0, std::min(g * group + group, h0 + gs.heads), L);
      // Positions j0 .. j0 + L - 1 live in rows r0 .. cap - 1, then 0 .. (wrapped).
      const int64_t r0 = j0 % cap;
      pass.run(kt, K + g * cap * hd, V + g * cap * hd, r0, std::min(L, cap - r0), scale);
    }
  });
}

}  // namespace dspark::ops
