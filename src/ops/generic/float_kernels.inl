// float_kernels.inl — the fp32 kernels of the table, written once over a
// 16-lane vector type and compiled once per kernel level (internal).
//
// Defines the entry points declared by DSPARK_FLOAT_KERNELS
// (generic/float_kernels.hpp). Included inside a level's namespace (dspark::ops::portable, ::avx2, ::neon)
// after that level has defined `struct Vec` (its 16-lane type and operations,
// see src/ops/portable/vec16.hpp for the reference semantics) and, for SIMD
// levels, after its `#pragma GCC target`. So each level gets its own copies
// of these templates, compiled for its instruction set, with the same
// sequence of fp32 operations per output (kernel_table.hpp's contract).
//
// Vec must provide (V: 16 floats):
//   load(const float*), load_n(const float*, n) (lanes >= n zero), store(float*, V),
//   store_n(float*, V, n), keep_n(V, n) (lanes >= n zeroed), set1(float), zero(), add, sub, mul, div, min, max
//   (max(a, b) = a > b ? a : b per lane), round_even(V) (|x| < 2^22),
//   pow2i(V) (2^n for integral n in [-126, 127]), abs(V), copysign(V mag, V sign),
//   hsum(V) (tree16), hmax(V).

/// exp(x) for every lane: x clamped to [-87, 88], n = round(x·log2 e),
/// r = (x - n·C1) - n·C2 (Cody-Waite, C1 + C2 = ln 2, n·C1 exact), then Cephes'
/// expf polynomial p(r) and p·2^n. Relative error about 2 ulp; exp(x) for
/// x < -87 gives exp(-87) ≈ 1.6e-38 (no denormals, no zero).
inline Vec::V vexp(Vec::V x) {
  using V = Vec::V;
  x = Vec::min(Vec::max(x, Vec::set1(-87.f)), Vec::set1(88.f));
  const V n = Vec::round_even(Vec::mul(x, Vec::set1(1.44269504088896341f)));
  V r = Vec::sub(x, Vec::mul(n, Vec::set1(0.693359375f)));
  r = Vec::sub(r, Vec::mul(n, Vec::set1(-2.12194440e-4f)));
  const V z = Vec::mul(r, r);
  V p = Vec::set1(1.9875691500e-4f);
  p = Vec::add(Vec::mul(p, r), Vec::set1(1.3981999507e-3f));
  p = Vec::add(Vec::mul(p, r), Vec::set1(8.3334519073e-3f));
  p = Vec::add(Vec::mul(p, r), Vec::set1(4.1665795894e-2f));
  p = Vec::add(Vec::mul(p, r), Vec::set1(1.6666665459e-1f));
  p = Vec::add(Vec::mul(p, r), Vec::set1(5.0000001201e-1f));
  p = Vec::add(Vec::add(Vec::mul(p, z), r), Vec::set1(1.f));
  return Vec::mul(p, Vec::pow2i(n));
}

// The 16 lane sums of a·b (before the tree16 of dot).
inline Vec::V dot_lanes(const float* a, const float* b, int64_t n) {
  Vec::V acc = Vec::zero();
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) acc = Vec::add(acc, Vec::mul(Vec::load(a + k), Vec::load(b + k)));
  if (k < n) {
    const int r = static_cast<int>(n - k);
    acc = Vec::add(acc, Vec::mul(Vec::load_n(a + k, r), Vec::load_n(b + k, r)));
  }
  return acc;
}

float dot(const float* a, const float* b, int64_t n) { return Vec::hsum(dot_lanes(a, b, n)); }

// dot_lanes of q with 4 consecutive key rows (K, K + hd, ...): each lane the
// same operations in the same order as dot_lanes, the four keys' add chains
// interleaved so that they overlap instead of waiting on one another.
inline void dot_lanes4(const float* q, const float* K, int64_t hd, Vec::V* lanes) {
  Vec::V a0 = Vec::zero(), a1 = Vec::zero(), a2 = Vec::zero(), a3 = Vec::zero();
  int64_t d = 0;
  for (; d + 16 <= hd; d += 16) {
    const Vec::V qv = Vec::load(q + d);
    a0 = Vec::add(a0, Vec::mul(qv, Vec::load(K + d)));
    a1 = Vec::add(a1, Vec::mul(qv, Vec::load(K + hd + d)));
    a2 = Vec::add(a2, Vec::mul(qv, Vec::load(K + 2 * hd + d)));
    a3 = Vec::add(a3, Vec::mul(qv, Vec::load(K + 3 * hd + d)));
  }
  if (d < hd) {
    const int r = static_cast<int>(hd - d);
    const Vec::V qv = Vec::load_n(q + d, r);
    a0 = Vec::add(a0, Vec::mul(qv, Vec::load_n(K + d, r)));
    a1 = Vec::add(a1, Vec::mul(qv, Vec::load_n(K + hd + d, r)));
    a2 = Vec::add(a2, Vec::mul(qv, Vec::load_n(K + 2 * hd + d, r)));
    a3 = Vec::add(a3, Vec::mul(qv, Vec::load_n(K + 3 * hd + d, r)));
  }
  lanes[0] = a0;
  lanes[1] = a1;
  lanes[2] = a2;
  lanes[3] = a3;
}

// out[k] = hsum(v[k]) for 8 values: a level may reduce them together
// (Vec::hsum8, the same tree16 additions for each), else one by one.
template <class W = Vec>
inline void hsum8(const typename W::V* v, float* out) {
  if constexpr (requires { W::hsum8(v, out); }) {
    W::hsum8(v, out);
  } else {
    for (int k = 0; k < 8; ++k) out[k] = W::hsum(v[k]);
  }
}

// out[k] = hsum(v[k]) · scale for 8 values: a level may scale them in
// registers (Vec::hsum8_scaled, the same products), else one by one.
template <class W = Vec>
inline void hsum8_scaled(const typename W::V* v, float scale, float* out) {
  if constexpr (requires { W::hsum8_scaled(v, scale, out); }) {
    W::hsum8_scaled(v, scale, out);
  } else {
    float d[8];
    hsum8<W>(v, d);
    for (int k = 0; k < 8; ++k) out[k] = d[k] * scale;
  }
}

void scores(const float* const* q, const int64_t* L, int nq, const float* K, int64_t hd, float scale,
            float* const* s) {
  int64_t lmax = 0;
  for (int i = 0; i < nq; ++i) lmax = L[i] > lmax ? L[i] : lmax;
  // Keys in blocks of 8 (their rows in L1 for every query), each block's 8
  // dot products reduced together; a query's last partial block key by key.
  for (int64_t j0 = 0; j0 < lmax; j0 += 8)
    for (int i = 0; i < nq; ++i) {
      if (j0 + 8 <= L[i]) {
        Vec::V lanes[8];
        dot_lanes4(q[i], K + j0 * hd, hd, lanes);
        dot_lanes4(q[i], K + (j0 + 4) * hd, hd, lanes + 4);
        hsum8_scaled(lanes, scale, s[i] + j0);
      } else {
        for (int64_t j = j0; j < L[i] && j < j0 + 8; ++j) s[i][j] = dot(q[i], K + j * hd, hd) * scale;
      }
    }
}

float softmax_num(float* p, int64_t L) {
  Vec::V m = Vec::set1(p[0]);
  int64_t j = 0;
  for (; j + 16 <= L; j += 16) m = Vec::max(m, Vec::load(p + j));
  float mx = Vec::hmax(m);
  for (; j < L; ++j) mx = p[j] > mx ? p[j] : mx;
  const Vec::V vm = Vec::set1(mx);
  Vec::V sum = Vec::zero();
  for (j = 0; j + 16 <= L; j += 16) {
    const Vec::V e = vexp(Vec::sub(Vec::load(p + j), vm));
    Vec::store(p + j, e);
    sum = Vec::add(sum, e);
  }
  if (j < L) {
    const int r = static_cast<int>(L - j);
    const Vec::V e = Vec::keep_n(vexp(Vec::sub(Vec::load_n(p + j, r), vm)), r);
    Vec::store_n(p + j, e, r);
    sum = Vec::add(sum, e);
  }
  return Vec::hsum(sum);
}

void pv(const float* const* p, int nq, const float* V, int64_t j0, int64_t j1, int64_t hd, float* const* acc) {
  // Keys in blocks whose value rows stay in L1 while every query reads them;
  // each query's accumulators for 64 dims stay in registers across a block.
  // Every acc[i][d] still adds the keys' terms one by one in key order.
  constexpr int64_t kKeys = 64, kDims = 64;
  for (int64_t jb = j0; jb < j1; jb += kKeys) {
    const int64_t je = jb + kKeys < j1 ? jb + kKeys : j1;
    for (int i = 0; i < nq; ++i) {
      const float* pi = p[i];
      float* a = acc[i];
      int64_t d0 = 0;
      for (; d0 + kDims <= hd; d0 += kDims) {
        Vec::V r0 = Vec::load(a + d0), r1 = Vec::load(a + d0 + 16), r2 = Vec::load(a + d0 + 32),
               r3 = Vec::load(a + d0 + 48);
        for (int64_t j = jb; j < je; ++j) {
          const Vec::V pj = Vec::set1(pi[j]);
          const float* v = V + j * hd + d0;
          r0 = Vec::add(r0, Vec::mul(pj, Vec::load(v)));
          r1 = Vec::add(r1, Vec::mul(pj, Vec::load(v + 16)));
          r2 = Vec::add(r2, Vec::mul(pj, Vec::load(v + 32)));
          r3 = Vec::add(r3, Vec::mul(pj, Vec::load(v + 48)));
        }
        Vec::store(a + d0, r0);
        Vec::store(a + d0 + 16, r1);
        Vec::store(a + d0 + 32, r2);
        Vec::store(a + d0 + 48, r3);
      }
      for (; d0 + 16 <= hd; d0 += 16) {
        Vec::V r = Vec::load(a + d0);
        for (int64_t j = jb; j < je; ++j) r = Vec::add(r, Vec::mul(Vec::set1(pi[j]), Vec::load(V + j * hd + d0)));
        Vec::store(a + d0, r);
      }
      for (; d0 < hd; ++d0)
        for (int64_t j = jb; j < je; ++j) a[d0] = a[d0] + pi[j] * V[j * hd + d0];
    }
  }
}

void rmsnorm(const float* x, const float* w, int64_t D, float eps, float* out) {
  const float ss = dot(x, x, D);
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
  const Vec::V vi = Vec::set1(inv);
  int64_t d = 0;
  for (; d + 16 <= D; d += 16) Vec::store(out + d, Vec::mul(Vec::mul(Vec::load(x + d), vi), Vec::load(w + d)));
  for (; d < D; ++d) out[d] = (x[d] * inv) * w[d];
}

void rope(float* v, const float* cs, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float c = cs[2 * i], s = cs[2 * i + 1];
    const float a = v[2 * i], b = v[2 * i + 1];
    v[2 * i] = a * c - b * s;
    v[2 * i + 1] = a * s + b * c;
  }
}

/// f(g) · u elementwise over n values, 16 at a time (the tail through load_n).
template <class F>
inline void map_mul(const float* g, const float* u, int64_t n, float* out, F f) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) Vec::store(out + i, Vec::mul(f(Vec::load(g + i)), Vec::load(u + i)));
  if (i < n) {
    const int r = static_cast<int>(n - i);
    Vec::store_n(out + i, Vec::mul(f(Vec::load_n(g + i, r)), Vec::load_n(u + i, r)), r);
  }
}

struct SiluFn {
  Vec::V operator()(Vec::V g) const {
    return Vec::div(g, Vec::add(Vec::set1(1.f), vexp(Vec::sub(Vec::zero(), g))));
  }
};

struct GeluTanhFn {
  Vec::V operator()(Vec::V x) const {
    const Vec::V x3 = Vec::mul(Vec::mul(x, x), x);
    const Vec::V z = Vec::mul(Vec::set1(0.7978845608028654f), Vec::add(x, Vec::mul(Vec::set1(0.044715f), x3)));
    return Vec::div(x, Vec::add(Vec::set1(1.f), vexp(Vec::mul(z, Vec::set1(-2.f)))));
  }
};

void silu_mul(const float* g, const float* u, int64_t n, float* out) { map_mul(g, u, n, out, SiluFn{}); }
void gelu_tanh_mul(const float* g, const float* u, int64_t n, float* out) {
  map_mul(g, u, n, out, GeluTanhFn{});
}

struct SoftcapFn {
  float cap;
  Vec::V operator()(Vec::V v) const {
    const Vec::V one = Vec::set1(1.f), two = Vec::set1(2.f);
    const Vec::V y = Vec::mul(v, Vec::set1(1.f / cap));
    const Vec::V e = vexp(Vec::mul(Vec::abs(y), two));
    const Vec::V t = Vec::sub(one, Vec::div(two, Vec::add(e, one)));
    return Vec::mul(Vec::set1(cap), Vec::copysign(t, y));
  }
};

void softcap(float* x, int64_t n, float cap) {
  const SoftcapFn f{cap};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) Vec::store(x + i, f(Vec::load(x + i)));
  if (i < n) {
    const int r = static_cast<int>(n - i);
    Vec::store_n(x + i, f(Vec::load_n(x + i, r)), r);
  }
}
