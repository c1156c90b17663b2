// CPU kernels of the target forward pass; see include/dspark/ops/kernels.hpp.
#include "dspark/ops/kernels.hpp"

#include <ATen/Parallel.h>

#include "simd_reduce.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "dspark/error.hpp"

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

namespace {


bool has_avx512bf16() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512bf16");
  return ok;
}

using simd::hsum16;
using simd::lane_of;
using simd::reduce16;

bool has_avx512f() {
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
}

// ---- linear: AVX512-BF16 ------------------------------------------------------
// Each dot product accumulates its own zmm register over k in steps of 32 and
// is then reduced by the same fixed pairwise tree (lanes l and l+8, then l and
// l+4, l and l+2, l and l+1). The tree is applied to 16 accumulators at once
// with shuffles; since every lane operation involves only one accumulator, a
// dot's result does not depend on the tile it was computed in, on N, or on the
// row split across threads.

// Prefetches the four 64-byte lines at column k of rows 0..3 of `pf`.
inline void prefetch4(const uint16_t* pf, int64_t K, int64_t k) {
  for (int i = 0; i < 4; ++i) _mm_prefetch(reinterpret_cast<const char*>(pf + i * K + k), _MM_HINT_T0);
}

// 4 weight rows x 4 input rows: acc[4*i + j] = dot(W_i, x_j). When `pf` is
// set, the same four rows of the next weight block are prefetched on the way
// (see linear_avx512bf16).
__attribute__((target("avx512f,avx512bw,avx512bf16"))) inline void tile4x4(
    const uint16_t* x, const uint16_t* W, int64_t K, float* y, int64_t ldy, int rows, int cols,
    const uint16_t* pf) {
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 32) {
    if (pf) prefetch4(pf, K, k);
    __m512bh w[4], xv[4];
    for (int i = 0; i < 4; ++i) w[i] = (__m512bh)_mm512_loadu_si512(W + i * K + k);
    for (int j = 0; j < 4; ++j) xv[j] = (__m512bh)_mm512_loadu_si512(x + j * K + k);
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) acc[4 * i + j] = _mm512_dpbf16_ps(acc[4 * i + j], w[i], xv[j]);
  }
  alignas(64) float r[16];
  _mm512_store_ps(r, reduce16(acc));
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) y[j * ldy + i] = r[lane_of(4 * i + j)];
}

// 16 weight rows x 1 input row: acc[i] = dot(W_i, x).
__attribute__((target("avx512f,avx512bw,avx512bf16"))) inline void tile16x1(
    const uint16_t* x, const uint16_t* W, int64_t K, float* y, int rows, const uint16_t* pf) {
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 32) {
    if (pf)
      for (int i = 0; i < 16; i += 4) prefetch4(pf + i * K, K, k);
    const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + k);
    for (int i = 0; i < 16; ++i)
      acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)_mm512_loadu_si512(W + i * K + k), xv);
  }
  alignas(64) float r[16];
  _mm512_store_ps(r, reduce16(acc));
  for (int i = 0; i < rows; ++i) y[i] = r[lane_of(i)];
}

// One block of 16 weight rows (`rows` of them real) against all N inputs.
// With N > 1 the inputs come padded with zero rows to a multiple of 4 (x has
// that many rows; only N results are written). `next` (or null) is the block
// computed after this one: the first pass over this block's weights
// prefetches it, so that the next block's memory traffic overlaps this
// block's arithmetic instead of following it. Neither changes any result:
// each dot product is computed the same way in every tile.
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void block16(
    const uint16_t* x, int64_t N, const uint16_t* W, int64_t K, float* y, int64_t ldy, int rows,
    const uint16_t* next) {
  if (N == 1) {
    tile16x1(x, W, K, y, rows, next);
    return;
  }
  for (int64_t n = 0; n < N; n += 4)
    for (int i = 0; i < 16 && i < rows; i += 4)
      tile4x4(x + n * K, W + i * K, K, y + n * ldy + i, ldy, std::min(4, rows - i),
              static_cast<int>(std::min<int64_t>(4, N - n)), n == 0 && next ? next + i * K : nullptr);
}

__attribute__((target("avx512f,avx512bw,avx512bf16"))) void linear_avx512bf16(
    const uint16_t* x, int64_t N, const uint16_t* W, int64_t O, int64_t K, float* y,
    int64_t ldy) {
  // Inputs padded with zero rows to a multiple of 4 (see block16).
  std::vector<uint16_t> xpad;
  if (N > 1 && N % 4 != 0) {
    xpad.assign(static_cast<size_t>((N + 3) / 4 * 4 * K), 0);
    std::memcpy(xpad.data(), x, sizeof(uint16_t) * N * K);
    x = xpad.data();
  }
  const int64_t full = O / 16;
  // About 64 KiB of weights per task keeps the per-task overhead small.
  const int64_t grain = std::max<int64_t>(1, 2048 / K);
  at::parallel_for(0, full, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      block16(x, N, W + b * 16 * K, K, y + b * 16, ldy, 16, b + 1 < b1 ? W + (b + 1) * 16 * K : nullptr);
  });
  if (const int rest = static_cast<int>(O - full * 16); rest > 0) {
    // Tail rows: zero-padded copy so the tiles never read past W.
    std::vector<uint16_t> pad(static_cast<size_t>(16 * K), 0);
    std::memcpy(pad.data(), W + full * 16 * K, sizeof(uint16_t) * rest * K);
    block16(x, N, pad.data(), K, y + full * 16, ldy, rest, nullptr);
  }
}

// ---- linear: portable ---------------------------------------------------------
// 16 partial sums per dot (one per lane of a 512-bit register in the fast
// path), combined pairwise at the end.
void linear_portable(const uint16_t* x, int64_t N, const uint16_t* W, int64_t O, int64_t K,
                     float* y, int64_t ldy) {
  at::parallel_for(0, O, std::max<int64_t>(1, 16384 / K), [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      const uint16_t* w = W + o * K;
      for (int64_t n = 0; n < N; ++n) {
        const uint16_t* xv = x + n * K;
        float part[16] = {0};
        for (int64_t k = 0; k < K; k += 16)
          for (int l = 0; l < 16; ++l) part[l] += bf16_to_f32(w[k + l]) * bf16_to_f32(xv[k + l]);
        for (int s = 8; s > 0; s /= 2)
          for (int l = 0; l < s; ++l) part[l] += part[l + s];
        y[n * ldy + o] = part[0];
      }
    }
  });
}

// ---- small helpers ---------------------------------------------------------------

__attribute__((target("avx512f"))) float dot_avx512(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  float s = hsum16(acc);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

float dot_portable(const float* a, const float* b, int64_t n) {
  float part[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) part[l] += a[i + l] * b[i + l];
  float s = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline float dot(const float* a, const float* b, int64_t n) {
  return has_avx512f() ? dot_avx512(a, b, n) : dot_portable(a, b, n);
}

}  // namespace

void linear_bf16(const uint16_t* x, int64_t N, const uint16_t* W, int64_t O, int64_t K, float* y,
                 int64_t ldy) {
  if (K % 32 != 0) {
    throw InvalidArgument("linear_bf16: inner dimension " + std::to_string(K) +
                          " is not a multiple of 32");
  }
  if (N == 0 || O == 0) return;
  if (has_avx512bf16()) {
    linear_avx512bf16(x, N, W, O, K, y, ldy);
  } else {
    linear_portable(x, N, W, O, K, y, ldy);
  }
}

void rmsnorm_f32(const float* x, const float* w, int64_t N, int64_t D, float eps, float* out) {
  for (int64_t n = 0; n < N; ++n) {
    const float* r = x + n * D;
    const float inv = 1.0f / std::sqrt(dot(r, r, D) / static_cast<float>(D) + eps);
    float* o = out + n * D;
    for (int64_t d = 0; d < D; ++d) o[d] = r[d] * inv * w[d];
  }
}

void rmsnorm_to_bf16(const float* x, const float* w, int64_t N, int64_t D, float eps,
                     uint16_t* out) {
  for (int64_t n = 0; n < N; ++n) {
    const float* r = x + n * D;
    const float inv = 1.0f / std::sqrt(dot(r, r, D) / static_cast<float>(D) + eps);
    uint16_t* o = out + n * D;
    for (int64_t d = 0; d < D; ++d) o[d] = f32_to_bf16(r[d] * inv * w[d]);
  }
}

void rope_pairs(float* x, int64_t T, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                int64_t rot_dim, const int64_t* positions, const float* inv_freq) {
  const int64_t half = rot_dim / 2;
  std::vector<float> cs(static_cast<size_t>(half * 2));
  for (int64_t t = 0; t < T; ++t) {
    const double pos = static_cast<double>(positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      const double a = pos * inv_freq[i];
      cs[2 * i] = static_cast<float>(std::cos(a));
      cs[2 * i + 1] = static_cast<float>(std::sin(a));
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + t * row_stride + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float c = cs[2 * i], s = cs[2 * i + 1];
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * c - b * s;
        v[2 * i + 1] = a * s + b * c;
      }
    }
  }
}

namespace {

// acc[d] = Σ_j p[j] * V_j[d] for d < hd (hd % 16 == 0), V_j = V + j*hd, summed
// over j in order with one fused multiply-add per term. 64 columns at a time
// stay in registers across all keys.
__attribute__((target("avx512f"))) void pv_avx512(const float* p, const float* V, int64_t L, int64_t hd,
                                                  float* acc) {
  for (int64_t d0 = 0; d0 < hd; d0 += 64) {
    const int nc = static_cast<int>(std::min<int64_t>(64, hd - d0) / 16);
    __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t j = 0; j < L; ++j) {
      const __m512 pj = _mm512_set1_ps(p[j]);
      const float* vr = V + j * hd + d0;
      for (int c = 0; c < nc; ++c) a[c] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vr + 16 * c), a[c]);
    }
    for (int c = 0; c < nc; ++c) _mm512_storeu_ps(acc + d0 + 16 * c, a[c]);
  }
}

// ---- attention: several queries sharing one key/value group -------------------
// The queries of one KV group (its heads, at every new position) read the same
// keys and values. Computing up to kMaxQueries of them in one pass over K and V
// reads each key and value row once per pass instead of once per query, which
// is what bounds attention over a long cache (the rows come from L2). Every
// (query, key) score and every output element is computed with exactly the
// operations, in exactly the order, of the one-query path (pv_avx512), so
// results do not depend on which queries share a pass.

constexpr int kMaxQueries = 6;  // 4 accumulators each for hd 64: 24 of 32 zmm

// scores[i][j] = dot(q[i], K_j) * scale for j < L[i], K_j = K + j*hd. Keys go
// 16 at a time: one accumulator per key over hd in steps of 16 (the same FMA
// sequence as dot_avx512), then reduce16, which applies hsum16's tree to all
// 16 at once; the rest one by one with dot_avx512. So every score equals
// dot(q, K_j) * scale bit for bit, whatever L and the other queries are.
__attribute__((target("avx512f"))) void scores_multi(const float* const* q, int nq, const float* K,
                                                     const int64_t* L, int64_t hd, float scale,
                                                     float* const* scores) {
  int64_t lmax = 0;
  for (int i = 0; i < nq; ++i) lmax = std::max(lmax, L[i]);
  for (int64_t j = 0; j + 16 <= lmax; j += 16) {
    for (int i = 0; i < nq; ++i) {
      if (j + 16 > L[i]) continue;
      __m512 acc[16];
      for (int a = 0; a < 16; ++a) {
        const float* kr = K + (j + a) * hd;
        __m512 s = _mm512_setzero_ps();
        for (int64_t d = 0; d < hd; d += 16)
          s = _mm512_fmadd_ps(_mm512_loadu_ps(q[i] + d), _mm512_loadu_ps(kr + d), s);
        acc[a] = s;
      }
      alignas(64) float r[16];
      _mm512_store_ps(r, reduce16(acc));
      for (int a = 0; a < 16; ++a) scores[i][j + a] = r[lane_of(a)] * scale;
    }
  }
  for (int i = 0; i < nq; ++i)
    for (int64_t j = L[i] / 16 * 16; j < L[i]; ++j) scores[i][j] = dot_avx512(q[i], K + j * hd, hd) * scale;
}

// acc[i][d] += Σ_{j0 <= j < j1} p[i][j] * V_j[d] for NQ queries, hd % 64 == 0:
// per element one fused multiply-add, over j in order (pv_avx512's rounding).
template <int NQ>
__attribute__((target("avx512f"))) void pv_multi(const float* const* p, const float* V, int64_t j0,
                                                 int64_t j1, int64_t hd, float* const* acc) {
  for (int64_t d0 = 0; d0 < hd; d0 += 64) {
    __m512 a[NQ][4];
    for (int i = 0; i < NQ; ++i)
      for (int c = 0; c < 4; ++c) a[i][c] = _mm512_loadu_ps(acc[i] + d0 + 16 * c);
    for (int64_t j = j0; j < j1; ++j) {
      const float* vr = V + j * hd + d0;
      __m512 v[4];
      for (int c = 0; c < 4; ++c) v[c] = _mm512_loadu_ps(vr + 16 * c);
      for (int i = 0; i < NQ; ++i) {
        const __m512 pj = _mm512_set1_ps(p[i][j]);
        for (int c = 0; c < 4; ++c) a[i][c] = _mm512_fmadd_ps(pj, v[c], a[i][c]);
      }
    }
    for (int i = 0; i < NQ; ++i)
      for (int c = 0; c < 4; ++c) _mm512_storeu_ps(acc[i] + d0 + 16 * c, a[i][c]);
  }
}

void pv_multi_n(int nq, const float* const* p, const float* V, int64_t j0, int64_t j1, int64_t hd,
                float* const* acc) {
  switch (nq) {
    case 1: return pv_multi<1>(p, V, j0, j1, hd, acc);
    case 2: return pv_multi<2>(p, V, j0, j1, hd, acc);
    case 3: return pv_multi<3>(p, V, j0, j1, hd, acc);
    case 4: return pv_multi<4>(p, V, j0, j1, hd, acc);
    case 5: return pv_multi<5>(p, V, j0, j1, hd, acc);
    case 6: return pv_multi<6>(p, V, j0, j1, hd, acc);
    default: throw InvalidArgument("pv_multi_n: " + std::to_string(nq) + " queries");
  }
}

// Attention with hd % 64 == 0 on AVX-512: work units (group, t, head within
// the group), group-major, so that a thread's contiguous share of units is a
// few runs of queries reading the same keys and values.
void attention_grouped(const float* q, int64_t q_stride, const float* K, const float* V, int64_t cap,
                       int64_t n_past, int64_t T, int64_t n_heads, int64_t n_kv, int64_t hd, float scale,
                       float* out, bool causal) {
  const int64_t group = n_heads / n_kv, per_group = T * group;
  const int64_t work = (n_past + T) * hd * 2;
  at::parallel_for(0, n_kv * per_group, std::max<int64_t>(1, 65536 / std::max<int64_t>(work, 1)),
                   [&](int64_t u0, int64_t u1) {
    const int64_t lcap = n_past + T;
    std::vector<float> pbuf(static_cast<size_t>(kMaxQueries * lcap)), abuf(static_cast<size_t>(kMaxQueries * hd));
    const float* qs[kMaxQueries];
    float* ps[kMaxQueries];
    float* accs[kMaxQueries];
    int64_t L[kMaxQueries], t_of[kMaxQueries], h_of[kMaxQueries];
    for (int i = 0; i < kMaxQueries; ++i) {
      ps[i] = pbuf.data() + i * lcap;
      accs[i] = abuf.data() + i * hd;
    }
    for (int64_t u = u0; u < u1;) {
      const int64_t g = u / per_group;
      const int nq = static_cast<int>(std::min<int64_t>({kMaxQueries, u1 - u, (g + 1) * per_group - u}));
      int64_t lmin = lcap;
      for (int i = 0; i < nq; ++i) {
        const int64_t r = u + i - g * per_group;
        t_of[i] = r / group;
        h_of[i] = g * group + r % group;
        qs[i] = q + t_of[i] * q_stride + h_of[i] * hd;
        L[i] = causal ? n_past + t_of[i] + 1 : n_past + T;
        lmin = std::min(lmin, L[i]);
      }
      const float* Kg = K + g * cap * hd;
      const float* Vg = V + g * cap * hd;
      scores_multi(qs, nq, Kg, L, hd, scale, ps);
      float inv[kMaxQueries];
      for (int i = 0; i < nq; ++i) {
        float* p = ps[i];
        float mx = -INFINITY;
        for (int64_t j = 0; j < L[i]; ++j) mx = std::max(mx, p[j]);
        float sum = 0.f;
        for (int64_t j = 0; j < L[i]; ++j) {
          p[j] = std::exp(p[j] - mx);
          sum += p[j];
        }
        inv[i] = 1.f / sum;
        std::fill(accs[i], accs[i] + hd, 0.f);
      }
      pv_multi_n(nq, ps, Vg, 0, lmin, hd, accs);
      for (int i = 0; i < nq; ++i)
        if (L[i] > lmin) pv_multi_n(1, ps + i, Vg, lmin, L[i], hd, accs + i);
      for (int i = 0; i < nq; ++i) {
        float* o = out + t_of[i] * n_heads * hd + h_of[i] * hd;
        for (int64_t d = 0; d < hd; ++d) o[d] = accs[i][d] * inv[i];
      }
      u += nq;
    }
  });
}

}  // namespace

void attention(const float* q, int64_t q_stride, const float* K, const float* V, int64_t cap,
               int64_t n_past, int64_t T, int64_t n_heads, int64_t n_kv, int64_t hd, float scale,
               float* out, bool causal) {
  if (has_avx512f() && hd % 64 == 0) {
    attention_grouped(q, q_stride, K, V, cap, n_past, T, n_heads, n_kv, hd, scale, out, causal);
    return;
  }
  const int64_t group = n_heads / n_kv;
  const int64_t work = (n_past + T) * hd * 2;
  const bool fast = has_avx512f() && hd % 16 == 0;
  // Parallel over (t, head); each pair is independent, so the split does not
  // change any result.
  at::parallel_for(0, T * n_heads, std::max<int64_t>(1, 65536 / std::max<int64_t>(work, 1)),
                   [&](int64_t i0, int64_t i1) {
    std::vector<float> p(static_cast<size_t>(n_past + T));
    std::vector<float> acc(static_cast<size_t>(hd));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / n_heads, h = i % n_heads, g = h / group;
      const float* qv = q + t * q_stride + h * hd;
      const float* Kg = K + g * cap * hd;
      const float* Vg = V + g * cap * hd;
      const int64_t L = causal ? n_past + t + 1 : n_past + T;
      if (fast) {
        float* ps = p.data();
        scores_multi(&qv, 1, Kg, &L, hd, scale, &ps);
      } else {
        for (int64_t j = 0; j < L; ++j) p[j] = dot(qv, Kg + j * hd, hd) * scale;
      }
      const float sum = simd::exp_shifted(p.data(), L);
      if (fast) {
        pv_avx512(p.data(), Vg, L, hd, acc.data());
      } else {
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t j = 0; j < L; ++j) {
          const float pj = p[j];
          const float* vr = Vg + j * hd;
          for (int64_t d = 0; d < hd; ++d) acc[d] += pj * vr[d];
        }
      }
      const float inv = 1.f / sum;
      float* o = out + t * n_heads * hd + h * hd;
      for (int64_t d = 0; d < hd; ++d) o[d] = acc[d] * inv;
    }
  });
}

void silu_mul(const float* gu, int64_t N, int64_t F, float* out) {
  // Elementwise, so any split over (n, f) gives the same bits; ~2K elements
  // per task keeps the exp-bound work worth a thread.
  at::parallel_for(0, N * F, 2048, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t n = i / F, f = i % F;
      const float g = gu[n * 2 * F + f], u = gu[n * 2 * F + F + f];
      out[i] = g / (1.f + std::exp(-g)) * u;
    }
  });
}

void add_rows(float* x, const float* y, int64_t N, int64_t D, int64_t ldy) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d) x[n * D + d] += y[n * ldy + d];
}

}  // namespace dspark::ops
