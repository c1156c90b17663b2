// Sliding-window attention over a ring-buffer cache; see
// include/dspark/ops/attention_window.hpp.
#include "dspark/ops/attention_window.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "simd_reduce.hpp"

namespace dspark::ops {

namespace {

bool has_avx512f() {
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
}

// s[j] = scale * q·k_j for the keys of positions j0 .. j0 + L - 1 (rows (j0 + j) % cap).
__attribute__((target("avx512f"))) void scores_avx512(const float* q, const float* K, int64_t cap, int64_t j0,
                                                      int64_t L, int64_t hd, float scale, float* s) {
  for (int64_t j = 0; j < L; ++j) {
    const float* k = K + ((j0 + j) % cap) * hd;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < hd; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(k + i), acc);
    s[j] = simd::hsum16(acc) * scale;
  }
}

void scores_portable(const float* q, const float* K, int64_t cap, int64_t j0, int64_t L, int64_t hd, float scale,
                     float* s) {
  for (int64_t j = 0; j < L; ++j) {
    const float* k = K + ((j0 + j) % cap) * hd;
    float acc[16] = {0};
    for (int64_t i = 0; i < hd; i += 16)
      for (int l = 0; l < 16; ++l) acc[l] = std::fma(q[i + l], k[i + l], acc[l]);
    s[j] = simd::tree16(acc) * scale;
  }
}

// acc[d] = Σ_j p[j] V_j[d] in position order, one fused multiply-add per term.
__attribute__((target("avx512f"))) void pv_avx512(const float* p, const float* V, int64_t cap, int64_t j0,
                                                  int64_t L, int64_t hd, float* acc) {
  for (int64_t d0 = 0; d0 < hd; d0 += 64) {
    const int nr = static_cast<int>(std::min<int64_t>(4, (hd - d0) / 16));
    __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t j = 0; j < L; ++j) {
      const float* v = V + ((j0 + j) % cap) * hd + d0;
      const __m512 pj = _mm512_set1_ps(p[j]);
      for (int r = 0; r < nr; ++r) a[r] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(v + 16 * r), a[r]);
    }
    for (int r = 0; r < nr; ++r) _mm512_storeu_ps(acc + d0 + 16 * r, a[r]);
  }
}

void pv_portable(const float* p, const float* V, int64_t cap, int64_t j0, int64_t L, int64_t hd, float* acc) {
  std::fill(acc, acc + hd, 0.f);
  for (int64_t j = 0; j < L; ++j) {
    const float* v = V + ((j0 + j) % cap) * hd;
    for (int64_t d = 0; d < hd; ++d) acc[d] = std::fma(p[j], v[d], acc[d]);
  }
}

}  // namespace

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
  const int64_t group = n_heads / n_kv;
  const int64_t L_max = std::min(window, n_past + T);
  const bool fast = has_avx512f();
  at::parallel_for(0, T * n_heads, std::max<int64_t>(1, 65536 / std::max<int64_t>(L_max * hd * 2, 1)),
                   [&](int64_t i0, int64_t i1) {
    std::vector<float> p(static_cast<size_t>(L_max)), acc(static_cast<size_t>(hd));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / n_heads, h = i % n_heads, g = h / group;
      const int64_t pos = n_past + t, j0 = std::max<int64_t>(0, pos - window + 1), L = pos - j0 + 1;
      const float* qv = q + t * q_stride + h * hd;
      const float* Kg = K + g * cap * hd;
      const float* Vg = V + g * cap * hd;
      if (fast) scores_avx512(qv, Kg, cap, j0, L, hd, scale, p.data());
      else scores_portable(qv, Kg, cap, j0, L, hd, scale, p.data());
      const float sum = simd::exp_shifted(p.data(), L);
      if (fast) pv_avx512(p.data(), Vg, cap, j0, L, hd, acc.data());
      else pv_portable(p.data(), Vg, cap, j0, L, hd, acc.data());
      const float inv = 1.f / sum;
      float* o = out + t * n_heads * hd + h * hd;
      for (int64_t d = 0; d < hd; ++d) o[d] = acc[d] * inv;
    }
  });
}

}  // namespace dspark::ops
