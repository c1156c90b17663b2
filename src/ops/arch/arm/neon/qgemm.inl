// NEON quantized tiles on packed weights (src/ops/qpack.hpp), included by
// qgemm.cpp (sdot) and qgemm_i8mm.cpp (sdot, and smmla for pairs of
// activation rows) inside their namespaces, with kI8mm set.
//
// A 16-row tile is computed as two halves of 8 rows, one row per 32-bit lane
// of two q registers (rows 0-3 and 4-7 of the half). For each fold unit the
// unit's code groups are unpacked once (group g: 4 codes of each row) and used
// for every activation row: the activation's 4 codes of group g are
// replicated to every lane (ld1r) and `sdot` adds the 4 products into each
// row's lane, so a lane sums its row's unit exactly in int32. All codes fit
// int8 (4-6 bit codes are unsigned and small; Q8_0 keeps its signed codes, so
// its sum needs no offset). The fold then runs for 4 rows per register with
// qmatmul.hpp's operations: acc = acc + I·(dw·dx), accm = accm + mw·(dx·s).
//
// With i8mm, two activation rows at a time: `smmla` multiplies a 2 × 8 block
// of int8 (two weight rows, 8 codes: groups g and g + 1 side by side) by
// another (two activation rows, the same 8 codes) into a 2 × 2 block of int32
// sums, 32 multiply-adds against sdot's 16. The zipped weight pairs are made
// once per unit, and one unzip per 4 weight rows gives each activation row
// its lanes back. Integer sums are exact in any order, so the fold sees the
// same I as with sdot, and the outputs are the same bits.
// (This file has no include guard: each including file defines the kernels
// once in its own namespace.)

namespace {

using detail::kQTypeInfo;
using detail::QType;
using detail::XPair;

struct Q2 {
  uint8x16_t a, b;  // rows 0-3, 4-7 of the half
};
inline Q2 load_q2(const uint8_t* p) { return {vld1q_u8(p), vld1q_u8(p + 16)}; }
struct F2 {
  float32x4_t a, b;
};
inline F2 half8(const uint8_t* p) {
  const float16x8_t h = vreinterpretq_f16_u8(vld1q_u8(p));
  return {vcvt_f32_f16(vget_low_f16(h)), vcvt_high_f32_f16(h)};
}
inline F2 u8x8(const uint8_t* p) {
  const uint16x8_t w = vmovl_u8(vld1_u8(p));
  return {vcvtq_f32_u32(vmovl_u16(vget_low_u16(w))), vcvtq_f32_u32(vmovl_high_u16(w))};
}
inline F2 s8x8(const uint8_t* p) {
  const int16x8_t w = vmovl_s8(vld1_s8(reinterpret_cast<const int8_t*>(p)));
  return {vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), vcvtq_f32_s32(vmovl_high_s16(w))};
}
inline F2 mul(F2 x, F2 y) { return {vmulq_f32(x.a, y.a), vmulq_f32(x.b, y.b)}; }
inline F2 negate(F2 x) { return {vnegq_f32(x.a), vnegq_f32(x.b)}; }

inline Q2 lo_nibbles(Q2 v) { return {vandq_u8(v.a, vdupq_n_u8(0x0F)), vandq_u8(v.b, vdupq_n_u8(0x0F))}; }
inline Q2 hi_nibbles(Q2 v) { return {vshrq_n_u8(v.a, 4), vshrq_n_u8(v.b, 4)}; }
// Bits moved by `shift` (negative: right) within each byte, masked.
inline Q2 bits(Q2 h, int shift, uint8_t mask) {
  const int8x16_t s = vdupq_n_s8(static_cast<int8_t>(shift));
  return {vandq_u8(vshlq_u8(h.a, s), vdupq_n_u8(mask)), vandq_u8(vshlq_u8(h.b, s), vdupq_n_u8(mask))};
}
inline Q2 orr(Q2 x, Q2 y) { return {vorrq_u8(x.a, y.a), vorrq_u8(x.b, y.b)}; }

template <QType T>
constexpr int kGroups = T == detail::kQ6_K ? 4 : 8;

struct Unit {
  Q2 codes[8];
  int groups[8];
  F2 dw, mw;
};

template <QType T>
inline void load_unit(const uint8_t* ch, int j, int u, int h, Unit& w) {
  const int r8 = 32 * h;
  if constexpr (T == detail::kQ8_0) {
    for (int i = 0; i < 8; ++i) {
      w.codes[i] = load_q2(ch + (8 * u + i) * 64 + r8);
      w.groups[i] = 8 * u + i;
    }
    w.dw = half8(ch + 1024 + (u * 16 + 8 * h) * 2);
  } else if constexpr (T == detail::kQ4_0 || T == detail::kQ4_1 || T == detail::kQ5_0) {
    for (int i = 0; i < 4; ++i) {
      const Q2 P = load_q2(ch + (4 * u + i) * 64 + r8);
      w.codes[i] = lo_nibbles(P);
      w.codes[4 + i] = hi_nibbles(P);
      w.groups[i] = 4 * u + i;
      w.groups[4 + i] = 8 + 4 * u + i;
    }
    if constexpr (T == detail::kQ5_0) {
      const Q2 H0 = load_q2(ch + 512 + r8), H1 = load_q2(ch + 576 + r8);
      for (int i = 0; i < 4; ++i) {
        w.codes[i] = orr(w.codes[i], bits(H0, 4 - (4 * u + i), 0x10));
        w.codes[4 + i] = orr(w.codes[4 + i], bits(H1, 4 - (4 * u + i), 0x10));
      }
    }
    const int sc = T == detail::kQ5_0 ? 640 : 512;
    w.dw = half8(ch + sc + (u * 16 + 8 * h) * 2);
    if constexpr (T == detail::kQ4_1) w.mw = half8(ch + sc + 64 + (u * 16 + 8 * h) * 2);
  } else if constexpr (T == detail::kQ4_K) {
    const uint8_t* nib = ch + 320 + j * 512;
    for (int i = 0; i < 8; ++i) {
      const Q2 P = load_q2(nib + i * 64 + r8);
      w.codes[i] = u == 0 ? lo_nibbles(P) : hi_nibbles(P);
      w.groups[i] = 8 * u + i;
    }
    const int k = 2 * j + u;
    w.dw = mul(half8(ch + 16 * h), u8x8(ch + 64 + k * 16 + 8 * h));
    w.mw = negate(mul(half8(ch + 32 + 16 * h), u8x8(ch + 192 + k * 16 + 8 * h)));
  } else {
    static_assert(T == detail::kQ6_K);
    const uint8_t* pj = ch + 288 + j * 768;
    const Q2 HB = load_q2(pj + 512 + u * 64 + r8);
    for (int i = 0; i < 4; ++i) {
      const Q2 P = load_q2(pj + (4 * (u % 2) + i) * 64 + r8);
      w.codes[i] = orr(u < 2 ? lo_nibbles(P) : hi_nibbles(P), bits(HB, 4 - 2 * i, 0x30));
      w.groups[i] = 4 * u + i;
    }
    w.dw = mul(half8(ch + 16 * h), s8x8(ch + 32 + (4 * j + u) * 16 + 8 * h));
  }
}

struct I2 {
  int32x4_t a, b;
};

template <int kN>
inline I2 unit_sum(const Unit& w, const XPair& a) {
  I2 s = {vdupq_n_s32(0), vdupq_n_s32(0)};
  for (int i = 0; i < kN; ++i) {
    int32_t g;
    std::memcpy(&g, a.q + 4 * w.groups[i], 4);
    const int8x16_t x = vreinterpretq_s8_s32(vdupq_n_s32(g));
    s.a = vdotq_s32(s.a, vreinterpretq_s8_u8(w.codes[i].a), x);
    s.b = vdotq_s32(s.b, vreinterpretq_s8_u8(w.codes[i].b), x);
  }
  return s;
}

// Bytes of weights prefetched ahead of the chunk computed (as on AVX2: the
// hardware prefetchers alone leave a one-row decode step waiting on memory).
constexpr int64_t kAheadBytes = 6144;

// A row's 8 outputs: the scaled integer sums (a) and Q4_1 / Q4_K's minimum
// terms (m), four lanes each.
struct Acc {
  float32x4_t a0, a1, m0, m1;
};

// Unit u's integer sums I with activation row a folded into the row's
// accumulators.
template <QType T>
inline void fold_sums(const Unit& w, I2 I, const XPair& a, int u, Acc& acc) {
  constexpr auto ti = kQTypeInfo[T];
  constexpr int shift = T == detail::kQ8_0 ? 0 : ti.shift;  // Q8_0's codes stay signed
  if constexpr (shift != 0) {
    const int32x4_t off = vdupq_n_s32(a.s[u] * (1 << shift));
    I = {vsubq_s32(I.a, off), vsubq_s32(I.b, off)};
  }
  const float32x4_t dx = vdupq_n_f32(a.dx[u]);
  acc.a0 = vaddq_f32(acc.a0, vmulq_f32(vcvtq_f32_s32(I.a), vmulq_f32(w.dw.a, dx)));
  acc.a1 = vaddq_f32(acc.a1, vmulq_f32(vcvtq_f32_s32(I.b), vmulq_f32(w.dw.b, dx)));
  if constexpr (ti.float_min) {
    const float32x4_t sdx = vdupq_n_f32(a.sdx[u]);
    acc.m0 = vaddq_f32(acc.m0, vmulq_f32(w.mw.a, sdx));
    acc.m1 = vaddq_f32(acc.m1, vmulq_f32(w.mw.b, sdx));
  }
}

// Unit u's products with activation row a folded into the row's accumulators.
template <QType T>
inline void fold(const Unit& w, const XPair& a, int u, Acc& acc) {
  fold_sums<T>(w, unit_sum<kGroups<T>>(w, a), a, u, acc);
}

// The unit's codes as weight-row pairs for smmla: z[i/2][q] holds rows 2q and
// 2q + 1 of the half, 8 codes each (groups g = groups[i] and g + 1; the
// layouts of qpack.hpp pair consecutive groups at even i).
template <int kN>
struct Zipped {
  int8x16_t z[kN / 2][4];
};
template <int kN>
inline Zipped<kN> zip_unit(const Unit& w) {
  Zipped<kN> p;
  for (int i = 0; i < kN; i += 2) {
    const int32x4_t a0 = vreinterpretq_s32_u8(w.codes[i].a), a1 = vreinterpretq_s32_u8(w.codes[i + 1].a);
    const int32x4_t b0 = vreinterpretq_s32_u8(w.codes[i].b), b1 = vreinterpretq_s32_u8(w.codes[i + 1].b);
    p.z[i / 2][0] = vreinterpretq_s8_s32(vzip1q_s32(a0, a1));  // rows 0, 1
    p.z[i / 2][1] = vreinterpretq_s8_s32(vzip2q_s32(a0, a1));  // rows 2, 3
    p.z[i / 2][2] = vreinterpretq_s8_s32(vzip1q_s32(b0, b1));  // rows 4, 5
    p.z[i / 2][3] = vreinterpretq_s8_s32(vzip2q_s32(b0, b1));  // rows 6, 7
  }
  return p;
}
// The unit's sums for activation rows a0 (I0) and a1 (I1).
template <int kN>
inline void unit_sum_pair(const Unit& w, const Zipped<kN>& p, const XPair& a0, const XPair& a1, I2& I0, I2& I1) {
  int32x4_t r[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
  for (int i = 0; i < kN; i += 2) {
    const int g = w.groups[i];
    const int8x16_t x = vcombine_s8(vld1_s8(a0.q + 4 * g), vld1_s8(a1.q + 4 * g));
    for (int q = 0; q < 4; ++q) r[q] = vmmlaq_s32(r[q], p.z[i / 2][q], x);
  }
  // r[q] = [row 2q · a0, row 2q · a1, row 2q+1 · a0, row 2q+1 · a1]
  I0 = {vuzp1q_s32(r[0], r[1]), vuzp1q_s32(r[2], r[3])};
  I1 = {vuzp2q_s32(r[0], r[1]), vuzp2q_s32(r[2], r[3])};
}

inline Acc load_acc(const float* p) { return {vld1q_f32(p), vld1q_f32(p + 4), vld1q_f32(p + 8), vld1q_f32(p + 12)}; }
inline void store_acc(float* p, const Acc& a) {
  vst1q_f32(p, a.a0);
  vst1q_f32(p + 4, a.a1);
  vst1q_f32(p + 8, a.m0);
  vst1q_f32(p + 12, a.m1);
}

// The tile for N activation rows. kOne (N = 1): the row's accumulators stay
// in registers for the whole tile; otherwise each row's live in `scratch`
// between units. Either way every lane sees the same operations in the same
// order.
template <QType T, bool kOne>
void tile_rows(const detail::QTile& t, const XPair* const* x, int64_t N, int64_t n_blocks32, float* y, int64_t ldy,
               float* scratch) {
  constexpr auto ti = kQTypeInfo[T];
  constexpr int U = detail::units_of(ti.layout);
  constexpr bool kK = T == detail::kQ4_K || T == detail::kQ6_K;
  constexpr int pairs_per_chunk = kK ? 4 : 1;
  const int64_t n_pairs = (n_blocks32 + 1) / 2, chunks = n_pairs / pairs_per_chunk;
  const bool odd = n_blocks32 % 2 != 0;
  const int64_t cb = detail::chunk_bytes(T), ahead = (kAheadBytes + cb - 1) / cb * cb;
  const float32x4_t zero = vdupq_n_f32(0.f);
  for (int h = 0; h < (t.rows > 8 ? 2 : 1); ++h) {
    Acc one = {zero, zero, zero, zero};
    if constexpr (!kOne)
      for (int64_t i = 0; i < 16 * N; ++i) scratch[i] = 0.f;
    for (int64_t c = 0; c < chunks; ++c) {
      const uint8_t* ch = t.packed + c * cb;
      if (h == 0)
        for (int64_t b = 0; b < cb; b += 64) __builtin_prefetch(ch + ahead + b, 0, 3);
      for (int j = 0; j < pairs_per_chunk; ++j) {
        const int64_t p = c * pairs_per_chunk + j;
        const int units = odd && p == n_pairs - 1 ? U / 2 : U;
        for (int u = 0; u < units; ++u) {
          Unit w;
          load_unit<T>(ch, j, u, h, w);
          if constexpr (kOne) {
            fold<T>(w, x[0][p], u, one);
          } else {
            int64_t n = 0;
            if constexpr (kI8mm) {
              const Zipped<kGroups<T>> z = zip_unit<kGroups<T>>(w);
              for (; n + 2 <= N; n += 2) {
                I2 I0, I1;
                unit_sum_pair<kGroups<T>>(w, z, x[n][p], x[n + 1][p], I0, I1);
                Acc a0 = load_acc(scratch + 16 * n), a1 = load_acc(scratch + 16 * (n + 1));
                fold_sums<T>(w, I0, x[n][p], u, a0);
                fold_sums<T>(w, I1, x[n + 1][p], u, a1);
                store_acc(scratch + 16 * n, a0);
                store_acc(scratch + 16 * (n + 1), a1);
              }
            }
            for (; n < N; ++n) {
              Acc acc = load_acc(scratch + 16 * n);
              fold<T>(w, x[n][p], u, acc);
              store_acc(scratch + 16 * n, acc);
            }
          }
        }
      }
    }
    const int rows = t.rows - 8 * h < 8 ? t.rows - 8 * h : 8;
    for (int64_t n = 0; n < N; ++n) {
      const Acc acc = kOne ? one : load_acc(scratch + 16 * n);
      const float32x4_t s0 = ti.float_min ? vaddq_f32(acc.a0, acc.m0) : acc.a0;
      const float32x4_t s1 = ti.float_min ? vaddq_f32(acc.a1, acc.m1) : acc.a1;
      float o[8];
      vst1q_f32(o, s0);
      vst1q_f32(o + 4, s1);
      for (int r = 0; r < rows; ++r) y[n * ldy + 8 * h + r] = o[r];
    }
  }
}

template <QType T>
void tile(const detail::QTile& t, const XPair* const* x, int64_t N, int64_t n_blocks32, float* y, int64_t ldy,
          float* scratch) {
  if (N == 1) tile_rows<T, true>(t, x, N, n_blocks32, y, ldy, scratch);
  else tile_rows<T, false>(t, x, N, n_blocks32, y, ldy, scratch);
}

}  // namespace

DSPARK_DEFINE_QTILES(tile)
