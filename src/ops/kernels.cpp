// CPU kernels of the target forward pass (drivers: argument checks, threads,
// heads and rows); the arithmetic runs in the active kernel level's table.
// See include/dspark/ops/kernels.hpp and src/ops/kernel_table.hpp.
#include "dspark/ops/kernels.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "attention_group.hpp"
#include "kernel_table.hpp"
#include "parallel.hpp"

namespace dspark::ops {

uint16_t f32_to_bf16(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float bf16_to_f32(uint16_t v) {
  const uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void linear_bf16(const uint16_t* x, int64_t N, const uint16_t* W, int64_t O, int64_t K, float* y,
                 int64_t ldy) {
  if (K % 32 != 0) {
    throw InvalidArgument("linear_bf16: inner dimension " + std::to_string(K) +
                          " is not a multiple of 32");
  }
  if (N == 0 || O == 0) return;
  const auto& kt = detail::active_kernels();
  const int64_t blocks = (O + 15) / 16;
  // About 64 KiB of weights per task keeps the per-task overhead small.
  detail::parallel_tasks(0, blocks, std::max<int64_t>(1, 2048 / K), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int rows = static_cast<int>(std::min<int64_t>(16, O - b * 16));
      const uint16_t* next = b + 1 < b1 ? W + (b + 1) * 16 * K : nullptr;
      kt.bf16_block(x, N, W + b * 16 * K, rows, K, y + b * 16, ldy, next);
    }
  });
}

void rmsnorm_f32(const float* x, const float* w, int64_t N, int64_t D, float eps, float* out) {
  const auto& kt = detail::active_kernels();
  for (int64_t n = 0; n < N; ++n) kt.rmsnorm(x + n * D, w, D, eps, out + n * D);
}

void rope_pairs(float* x, int64_t T, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                int64_t rot_dim, const int64_t* positions, const float* inv_freq) {
  const auto& kt = detail::active_kernels();
  const int64_t half = rot_dim / 2;
  // One task per position: the angles (double cos/sin) dominate, and a block
  // of positions done on one thread would leave the other waiting past its
  // spin, to be woken again for the next product.
  detail::parallel_tasks(0, T, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> cs(static_cast<size_t>(half * 2));
    for (int64_t t = t0; t < t1; ++t) {
      const double pos = static_cast<double>(positions[t]);
      for (int64_t i = 0; i < half; ++i) {
        const double a = pos * inv_freq[i];
        cs[2 * i] = static_cast<float>(std::cos(a));
        cs[2 * i + 1] = static_cast<float>(std::sin(a));
      }
      for (int64_t h = 0; h < n_heads; ++h) kt.rope(x + t * row_stride + h * head_dim, cs.data(), half);
    }
  });
}

void attention(const float* q, int64_t q_stride, const float* K, const float* V, int64_t cap,
               int64_t n_past, int64_t T, int64_t n_heads, int64_t n_kv, int64_t hd, float scale,
               float* out, bool causal) {
  if (T == 0) return;
  const auto& kt = detail::active_kernels();
  const int64_t group = n_heads / n_kv, lmax = n_past + T;
  // Passes over one KV group's keys and values: a block of its heads at a
  // block of positions. Which queries share a pass never changes a result.
  const auto gs = detail::group_shape(group, n_kv, T, true, 2 * at::get_num_threads());
  const int64_t hblocks = (group + gs.heads - 1) / gs.heads, tblocks = (T + gs.positions - 1) / gs.positions;
  detail::parallel_tasks(0, n_kv * hblocks * tblocks, 1, [&](int64_t u0, int64_t u1) {
    detail::GroupAttention pass(lmax, hd);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t g = u / (hblocks * tblocks), hb = (u / tblocks) % hblocks, tb = u % tblocks;
      const int64_t h0 = g * group + hb * gs.heads, h1 = std::min(g * group + group, h0 + gs.heads);
      for (int64_t t = tb * gs.positions; t < std::min(T, (tb + 1) * gs.positions); ++t)
        pass.add_heads(q, q_stride, out, n_heads, t, h0, h1, causal ? n_past + t + 1 : lmax);
      pass.run(kt, K + g * cap * hd, V + g * cap * hd, 0, lmax, scale);
    }
  });
}

void silu_mul(const float* gu, int64_t N, int64_t F, float* out) {
  const auto& kt = detail::active_kernels();
  // Elementwise, so any split gives the same bits; ~2K elements per task
  // keeps the exp-bound work worth a thread.
  const int64_t per_row = (F + 2047) / 2048;
  detail::parallel_tasks(0, N * per_row, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t n = i / per_row, f0 = (i % per_row) * 2048, nf = std::min<int64_t>(2048, F - f0);
      kt.silu_mul(gu + n * 2 * F + f0, gu + n * 2 * F + F + f0, nf, out + n * F + f0);
    }
  });
}

void add_rows(float* x, const float* y, int64_t N, int64_t D, int64_t ldy) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d) x[n * D + d] += y[n * ldy + d];
}

void weighted_rows(const float* p, const float* rows, int64_t n, int64_t D, float* acc) {
  if (n <= 0 || D <= 0) return;
  detail::active_kernels().pv(&p, 1, rows, 0, n, D, &acc);
}

}  // namespace dspark::ops
