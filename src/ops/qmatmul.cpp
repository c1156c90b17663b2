// Integer matrix products on ggml-quantized weights; see
// include/dspark/ops/qmatmul.hpp for the arithmetic and its invariance.
//
// Pairs. Weights and activations go 64 elements at a time ("a pair" of
// 32-element blocks). A pair of codes is 64 bytes in one of three orders:
//   natural32: byte i is element 64p + i; fold units are the two 32-element
//              blocks (Q8_0, Q4_K);
//   nibble32:  bytes  0-15 = elements  0-15 of block 2p,  16-31 = 0-15 of 2p+1,
//              bytes 32-47 = elements 16-31 of block 2p,  48-63 = 16-31 of 2p+1
//              (Q4_0, Q4_1, Q5_0: a block's low nibbles hold elements 0-15 and
//              its high nibbles 16-31, so two blocks' code bytes unpack into
//              this order with one mask and one shift); units: the two blocks;
//   natural16: natural order, four 16-element units (Q6_K's sub-blocks).
// Every aligned 4-byte group of a pair belongs to one unit.
//
// Kernels. A tile is 16 weight rows x one pair: each row's 64 codes are
// unpacked into a zmm register, and the 16 registers are transposed so that
// register j holds code group j (4 bytes) of all 16 rows, one row per lane.
// `vpdpbusd` of register j with activation group j broadcast adds that
// group's 4 products into each row's lane, so a lane sums its row's unit
// exactly in int32; the unit's fp32 fold step then runs for 16 rows at once.
#include "dspark/ops/qmatmul.hpp"

#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>

#include "dspark/error.hpp"
#include "dspark/io/dequant.hpp"
#include "simd_reduce.hpp"

namespace dspark::ops {

using io::GGMLType;

namespace {

// Activation formats: byte order, fold units and quantization (see the file
// comment). Q8_0 and the nibble types quantize x like ggml's Q8_0 / Q8_1
// (a scale per 32), the K-quants like Q8_K (a scale per 256).
enum Layout { kNatural32 = 0, kNibble32 = 1, kNatural32K = 2, kNatural16K = 3 };
constexpr int kLayouts = 4;
constexpr bool per256(Layout l) { return l == kNatural32K || l == kNatural16K; }

/// One activation pair: codes in the layout's order and, per fold unit, the
/// unit's block scale dx, its code sum s and dx·s.
struct XPair {
  int8_t q[64];
  float dx[4];
  int32_t s[4];
  float sdx[4];
};
constexpr int64_t kPairBytes = sizeof(XPair);

struct TypeInfo {
  int64_t block_elems, block_bytes;
  Layout layout;
  int shift;       // integer offset -(1 << shift) per code; 0 = none
  bool float_min;  // adds mw·dx·s (Q4_1, Q4_K)
};

constexpr TypeInfo kUnsupported = {0, 0, kNatural32, 0, false};

constexpr TypeInfo type_info_of(GGMLType t) {
  switch (t) {
    case GGMLType::Q8_0: return {32, 34, kNatural32, 7, false};
    case GGMLType::Q4_0: return {32, 18, kNibble32, 3, false};
    case GGMLType::Q4_1: return {32, 20, kNibble32, 0, true};
    case GGMLType::Q5_0: return {32, 22, kNibble32, 4, false};
    case GGMLType::Q4_K: return {256, 144, kNatural32K, 0, true};
    case GGMLType::Q6_K: return {256, 210, kNatural16K, 5, false};
    default: return kUnsupported;
  }
}

TypeInfo type_info(GGMLType t) {
  const TypeInfo ti = type_info_of(t);
  if (ti.block_elems == 0)
    throw InvalidArgument("qlinear: unsupported weight type " + io::ggml_type_name(static_cast<uint32_t>(t)));
  return ti;
}

constexpr int units_of(Layout l) { return l == kNatural16K ? 4 : 2; }

// Element e (0..63) of a pair -> its byte position in the layout.
inline int byte_of(Layout l, int e) {
  if (l != kNibble32) return e;
  const int blk = e / 32, j = e % 32;
  return (j < 16 ? 0 : 32) + 16 * blk + (j % 16);
}
// Code group (4 bytes, 0..15) -> fold unit.
constexpr int unit_of_group(Layout l, int g) {
  return l == kNibble32 ? (g / 4) % 2 : l == kNatural16K ? g / 4 : g / 8;
}

inline uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline float f16(const uint8_t* p) { return io::half_to_float(load_u16(p)); }

// Unpacks the 6-bit scale and min of Q4_K sub-block k (0..7).
inline void q4k_scale_min(const uint8_t* s, int k, int& sc, int& mn) {
  if (k < 4) {
    sc = s[k] & 63;
    mn = s[k + 4] & 63;
  } else {
    sc = (s[k + 4] & 0x0F) | ((s[k - 4] >> 6) << 4);
    mn = (s[k + 4] >> 4) | ((s[k] >> 6) << 4);
  }
}

// ---- portable path: one (weight row, activation row) product --------------------

// Pair p of a weight row: unsigned codes in element order and per-unit scales.
// `half`: the row ends after block 2p (the second block contributes nothing).
struct RowPair {
  uint8_t el[64];
  float dw[4], mw[4];
};

void decode_portable(GGMLType t, const uint8_t* row, int64_t p, bool half, RowPair& o) {
  const TypeInfo ti = type_info(t);
  std::memset(&o, 0, sizeof o);
  switch (t) {
    case GGMLType::Q8_0:
    case GGMLType::Q4_0:
    case GGMLType::Q4_1:
    case GGMLType::Q5_0:
      for (int b = 0; b < (half ? 1 : 2); ++b) {
        const uint8_t* blk = row + (2 * p + b) * ti.block_bytes;
        o.dw[b] = f16(blk);
        uint8_t* e = o.el + 32 * b;
        if (t == GGMLType::Q8_0) {
          for (int j = 0; j < 32; ++j) e[j] = static_cast<uint8_t>(blk[2 + j] ^ 0x80);
        } else {
          const int off = t == GGMLType::Q4_1 ? 4 : t == GGMLType::Q5_0 ? 6 : 2;
          const uint32_t qh = t == GGMLType::Q5_0 ? load_u32(blk + 2) : 0;
          for (int j = 0; j < 16; ++j) {
            e[j] = static_cast<uint8_t>((blk[off + j] & 0x0F) | (((qh >> j) & 1) << 4));
            e[j + 16] = static_cast<uint8_t>((blk[off + j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
          }
        }
        if (t == GGMLType::Q4_1) o.mw[b] = f16(blk + 2);
      }
      break;
    case GGMLType::Q4_K: {
      const uint8_t* sb = row + (p / 4) * ti.block_bytes;
      const int j = static_cast<int>(p % 4);
      const float d = f16(sb), dmin = f16(sb + 2);
      const uint8_t* qs = sb + 16 + 32 * j;
      for (int l = 0; l < 32; ++l) {
        o.el[l] = qs[l] & 0x0F;
        o.el[l + 32] = qs[l] >> 4;
      }
      for (int b = 0; b < 2; ++b) {
        int sc, mn;
        q4k_scale_min(sb + 4, 2 * j + b, sc, mn);
        o.dw[b] = d * static_cast<float>(sc);
        o.mw[b] = -(dmin * static_cast<float>(mn));
      }
      break;
    }
    case GGMLType::Q6_K: {
      const uint8_t* sb = row + (p / 4) * ti.block_bytes;
      const int j4 = static_cast<int>(p % 4), h = j4 / 2, jj = j4 % 2;
      const uint8_t* ql = sb + 64 * h;
      const uint8_t* qh = sb + 128 + 32 * h;
      const auto* sc = reinterpret_cast<const int8_t*>(sb + 192 + 8 * h + 4 * jj);
      const float d = f16(sb + 208);
      for (int l = 0; l < 32; ++l) {
        const int s0 = 4 * jj, s1 = 4 * jj + 2;
        o.el[l] = static_cast<uint8_t>((jj ? ql[l] >> 4 : ql[l] & 0x0F) | (((qh[l] >> s0) & 3) << 4));
        o.el[l + 32] = static_cast<uint8_t>((jj ? ql[l + 32] >> 4 : ql[l + 32] & 0x0F) | (((qh[l] >> s1) & 3) << 4));
      }
      for (int u = 0; u < 4; ++u) o.dw[u] = d * static_cast<float>(sc[u]);
      break;
    }
    default: break;
  }
}

float dot_portable(GGMLType t, const uint8_t* row, int64_t n_blocks32, const XPair* x) {
  const TypeInfo ti = type_info(t);
  const int U = units_of(ti.layout), per_unit = 64 / U;
  const int64_t n_pairs = (n_blocks32 + 1) / 2;
  float acc = 0.f, accm = 0.f;
  RowPair w;
  for (int64_t p = 0; p < n_pairs; ++p) {
    decode_portable(t, row, p, 2 * p + 1 == n_blocks32, w);
    const XPair& a = x[p];
    for (int u = 0; u < U; ++u) {
      int32_t i = ti.shift ? -(a.s[u] * (1 << ti.shift)) : 0;
      for (int e = u * per_unit; e < (u + 1) * per_unit; ++e)
        i += static_cast<int32_t>(w.el[e]) * a.q[byte_of(ti.layout, e)];
      acc = std::fma(static_cast<float>(i), w.dw[u] * a.dx[u], acc);
      if (ti.float_min) accm = std::fma(w.mw[u], a.sdx[u], accm);
    }
  }
  return acc + accm;
}

// ---- AVX512-VNNI path ----------------------------------------------------------------

#define DSPARK_VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,f16c")))

// Two blocks' 16 nibble bytes each -> nibble32-order codes.
DSPARK_VNNI inline __m512i unpack_nibbles(__m128i a, __m128i b) {
  const __m256i ab = _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
  const __m256i m = _mm256_set1_epi8(0x0F);
  const __m256i lo = _mm256_and_si256(ab, m);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(ab, 4), m);
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// Codes of pair p of one weight row, in the type's layout.
template <GGMLType T>
DSPARK_VNNI inline __m512i row_codes(const uint8_t* row, int64_t p, bool half) {
  if constexpr (T == GGMLType::Q8_0) {
    const uint8_t* b0 = row + 2 * p * 34;
    const __m256i q0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 2));
    const __m256i q1 = half ? _mm256_set1_epi8(static_cast<char>(0x80))
                            : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 36));
    return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1),
                            _mm512_set1_epi8(static_cast<char>(0x80)));
  } else if constexpr (T == GGMLType::Q4_0 || T == GGMLType::Q4_1 || T == GGMLType::Q5_0) {
    constexpr int64_t bb = T == GGMLType::Q4_0 ? 18 : T == GGMLType::Q4_1 ? 20 : 22;
    constexpr int off = T == GGMLType::Q4_0 ? 2 : T == GGMLType::Q4_1 ? 4 : 6;
    const uint8_t* b0 = row + 2 * p * bb;
    const uint8_t* b1 = b0 + bb;
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + off));
    const __m128i b = half ? _mm_setzero_si128() : _mm_loadu_si128(reinterpret_cast<const __m128i*>(b1 + off));
    __m512i q = unpack_nibbles(a, b);
    if constexpr (T == GGMLType::Q5_0) {
      const uint64_t h0 = load_u32(b0 + 2), h1 = half ? 0 : load_u32(b1 + 2);
      const __mmask64 hi = (h0 & 0xFFFF) | ((h1 & 0xFFFF) << 16) | ((h0 >> 16) << 32) | ((h1 >> 16) << 48);
      q = _mm512_mask_add_epi8(q, hi, q, _mm512_set1_epi8(16));
    }
    return q;
  } else if constexpr (T == GGMLType::Q4_K) {
    const __m256i raw =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + (p / 4) * 144 + 16 + 32 * (p % 4)));
    const __m256i m = _mm256_set1_epi8(0x0F);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(raw, m)),
                              _mm256_and_si256(_mm256_srli_epi16(raw, 4), m), 1);
  } else {
    static_assert(T == GGMLType::Q6_K);
    const uint8_t* sb = row + (p / 4) * 210;
    const int j4 = static_cast<int>(p % 4), h = j4 / 2, jj = j4 % 2;
    const __m512i ql = _mm512_loadu_si512(sb + 64 * h);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i nib = jj ? _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4) : _mm512_and_si512(ql, m4);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + 128 + 32 * h));
    const __m512i qhz = _mm512_inserti64x4(_mm512_castsi256_si512(qh), qh, 1);
    const __m512i sh = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(4 * jj)),
                                          _mm256_set1_epi16(static_cast<short>(4 * jj + 2)), 1);
    const __m512i hb = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qhz, sh), _mm512_set1_epi8(3)), 4);
    return _mm512_or_si512(nib, hb);
  }
}

// 16x16 transpose of 32-bit elements: afterwards r[j] lane i = old r[i] lane j.
DSPARK_VNNI inline void transpose16(__m512i* r) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int h = 0; h < 16; h += 8)
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_shuffle_i32x4(r[h + i], r[h + 4 + i], 0x88);
      t[h + 4 + i] = _mm512_shuffle_i32x4(r[h + i], r[h + 4 + i], 0xdd);
    }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0xdd);
  }
}

// 16 lanes of the dword at byte `off` of each row (row offsets in `rows`).
DSPARK_VNNI inline __m512i gather_rows(const uint8_t* base, __m512i rows, int64_t off) {
  return _mm512_i32gather_epi32(_mm512_add_epi32(rows, _mm512_set1_epi32(static_cast<int>(off))), base, 1);
}

// 8x8 transposes of 32-bit elements in both 256-bit halves of P[0..7]:
// afterwards P[j] half h lane i = old P[i] half h lane j.
DSPARK_VNNI inline void transpose8x2(__m512i* P) {
  __m512i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm512_unpacklo_epi32(P[i], P[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(P[i], P[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  for (int i = 0; i < 4; ++i) {
    P[i] = _mm512_permutex2var_epi64(u[i], lo, u[4 + i]);
    P[4 + i] = _mm512_permutex2var_epi64(u[i], hi, u[4 + i]);
  }
}

// Codes of pair p for 16 rows, transposed: g[j] lane r = code group j of row r.
// The 4-bit types move their 32 packed bytes per row (8 dwords) through an
// 8x8 transpose per row half and unpack nibbles afterwards: group j < 8 is
// the low nibbles of packed dword j, group j + 8 its high nibbles (the
// nibble32 order for Q4_0/Q4_1/Q5_0, natural order for Q4_K).
template <GGMLType T>
DSPARK_VNNI inline void tile_codes(const uint8_t* base, const int32_t* offs, int64_t p, bool half, __m512i* g) {
  if constexpr (T == GGMLType::Q4_0 || T == GGMLType::Q4_1 || T == GGMLType::Q5_0 || T == GGMLType::Q4_K) {
    __m512i P[8];
    if constexpr (T == GGMLType::Q4_K) {
      const int64_t at = (p / 4) * 144 + 16 + 32 * (p % 4);
      for (int i = 0; i < 8; ++i)
        P[i] = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + offs[i] + at))),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + offs[i + 8] + at)), 1);
    } else {
      constexpr int bb = T == GGMLType::Q4_0 ? 18 : T == GGMLType::Q4_1 ? 20 : 22;
      constexpr int off = T == GGMLType::Q4_0 ? 2 : T == GGMLType::Q4_1 ? 4 : 6;
      alignas(64) static constexpr auto idx = [] {
        std::array<uint8_t, 64> a{};
        for (int k = 0; k < 16; ++k) {
          a[k] = static_cast<uint8_t>(off + k);
          a[16 + k] = static_cast<uint8_t>(bb + off + k);
          a[32 + k] = static_cast<uint8_t>(64 + off + k);
          a[48 + k] = static_cast<uint8_t>(64 + bb + off + k);
        }
        return a;
      }();
      const __m512i ix = _mm512_load_si512(idx.data());
      const __mmask64 m = half ? (__mmask64{1} << bb) - 1 : (__mmask64{1} << (2 * bb)) - 1;
      const int64_t at = 2 * p * bb;
      for (int i = 0; i < 8; ++i)
        P[i] = _mm512_permutex2var_epi8(_mm512_maskz_loadu_epi8(m, base + offs[i] + at), ix,
                                        _mm512_maskz_loadu_epi8(m, base + offs[i + 8] + at));
    }
    transpose8x2(P);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int j = 0; j < 8; ++j) {
      g[j] = _mm512_and_si512(P[j], m4);
      g[j + 8] = _mm512_and_si512(_mm512_srli_epi16(P[j], 4), m4);
    }
    if constexpr (T == GGMLType::Q5_0) {
      // Fifth bits: element e of block b is bit e of that block's qh. Lane r of
      // group j holds 4 elements of one block; vpshufbitqmb picks their bits
      // from qword lanes holding the qh of rows 2L (low dword) and 2L+1.
      const __m512i rows = _mm512_load_si512(offs);
      const __m512i h0 = gather_rows(base, rows, 2 * p * 22 + 2);
      const __m512i h1 = half ? _mm512_setzero_si512() : gather_rows(base, rows, (2 * p + 1) * 22 + 2);
      alignas(64) static constexpr auto sel = [] {
        std::array<std::array<uint8_t, 64>, 16> a{};
        for (int j = 0; j < 16; ++j)
          for (int i = 0; i < 64; ++i)
            a[j][i] = static_cast<uint8_t>(((i % 8) / 4) * 32 + (j < 8 ? 0 : 16) + 4 * (j % 4) + i % 4);
        return a;
      }();
      for (int j = 0; j < 16; ++j) {
        const __mmask64 hb = _mm512_bitshuffle_epi64_mask((j / 4) % 2 ? h1 : h0, _mm512_load_si512(sel[j].data()));
        g[j] = _mm512_mask_add_epi8(g[j], hb, g[j], _mm512_set1_epi8(16));
      }
    }
  } else {
    for (int r = 0; r < 16; ++r) g[r] = row_codes<T>(base + offs[r], p, half);
    transpose16(g);
  }
}

// Low / high binary16 of each lane -> fp32.
DSPARK_VNNI inline __m512 half_lo(__m512i v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)); }
DSPARK_VNNI inline __m512 half_hi(__m512i v) { return half_lo(_mm512_srli_epi32(v, 16)); }
DSPARK_VNNI inline __m512 byte_field(__m512i v, int shift, int mask) {
  return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, shift), _mm512_set1_epi32(mask)));
}

// Per-unit scales of pair p for 16 rows: lane r of dw[u] / mw[u] is row r's.
template <GGMLType T>
DSPARK_VNNI inline void tile_scales(const uint8_t* base, __m512i rows, int64_t p, bool half, __m512* dw, __m512* mw) {
  if constexpr (T == GGMLType::Q8_0 || T == GGMLType::Q4_0 || T == GGMLType::Q4_1 || T == GGMLType::Q5_0) {
    constexpr int64_t bb = T == GGMLType::Q8_0 ? 34 : T == GGMLType::Q4_0 ? 18 : T == GGMLType::Q4_1 ? 20 : 22;
    for (int b = 0; b < 2; ++b) {
      if (b == 1 && half) {
        dw[1] = mw[1] = _mm512_setzero_ps();
        break;
      }
      const __m512i g = gather_rows(base, rows, (2 * p + b) * bb);
      dw[b] = half_lo(g);
      if constexpr (T == GGMLType::Q4_1) mw[b] = half_hi(g);
    }
  } else if constexpr (T == GGMLType::Q4_K) {
    const int64_t sb = (p / 4) * 144;
    const int j = static_cast<int>(p % 4);
    const __m512i dd = gather_rows(base, rows, sb);
    const __m512 d = half_lo(dd), dmin = half_hi(dd);
    const __m512i A = gather_rows(base, rows, sb + 4), B = gather_rows(base, rows, sb + 8);
    for (int b = 0; b < 2; ++b) {
      const int k = 2 * j + b;
      __m512 sc, mn;
      if (k < 4) {
        sc = byte_field(A, 8 * k, 63);
        mn = byte_field(B, 8 * k, 63);
      } else {
        const __m512i C = gather_rows(base, rows, sb + 12);
        const int k4 = 8 * (k - 4);
        const __m512i lo4 = _mm512_and_si512(_mm512_srli_epi32(C, k4), _mm512_set1_epi32(0x0F));
        const __m512i hi4 = _mm512_and_si512(_mm512_srli_epi32(C, k4 + 4), _mm512_set1_epi32(0x0F));
        const __m512i a2 = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(A, k4 + 6), _mm512_set1_epi32(3)), 4);
        const __m512i b2 = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(B, k4 + 6), _mm512_set1_epi32(3)), 4);
        sc = _mm512_cvtepi32_ps(_mm512_or_si512(lo4, a2));
        mn = _mm512_cvtepi32_ps(_mm512_or_si512(hi4, b2));
      }
      dw[b] = _mm512_mul_ps(d, sc);
      mw[b] = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(dmin, mn));
    }
  } else {
    static_assert(T == GGMLType::Q6_K);
    const int64_t sb = (p / 4) * 210;
    const int j4 = static_cast<int>(p % 4), h = j4 / 2, jj = j4 % 2;
    const __m512 d = half_hi(gather_rows(base, rows, sb + 206));
    const __m512i sc = gather_rows(base, rows, sb + 192 + 8 * h + 4 * jj);
    for (int u = 0; u < 4; ++u)
      dw[u] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(sc, 24 - 8 * u), 24)));
  }
}

template <GGMLType T>
struct Traits {
  static constexpr TypeInfo ti = type_info_of(T);
  static constexpr int U = units_of(ti.layout);
};

// Up to 16 weight rows (r0..r0+rows-1) against N activation rows:
// y[n * ldy + r] for r < rows. Missing rows repeat row r0 (results dropped).
template <GGMLType T>
DSPARK_VNNI void tile16(const QMatrix& W, int64_t r0, int rows, const XPair* const* x, int64_t N,
                        int64_t n_blocks32, float* y, int64_t ldy, float* acc) {
  using Tr = Traits<T>;
  constexpr int U = Tr::U;
  const int64_t n_pairs = (n_blocks32 + 1) / 2;
  const bool odd = n_blocks32 % 2 != 0;
  const int64_t rb = W.row_bytes();
  const uint8_t* base = W.row(r0);
  alignas(64) int32_t offs[16];
  for (int r = 0; r < 16; ++r) offs[r] = static_cast<int32_t>(r < rows ? r * rb : 0);
  const __m512i rows_v = _mm512_load_si512(offs);
  const int64_t pf_lines = (16 * rb / 64 + n_pairs - 1) / n_pairs;
  std::fill(acc, acc + 32 * N, 0.f);  // [N][acc, accm][16 lanes], 64-byte aligned
  for (int64_t p = 0; p < n_pairs; ++p) {
    const bool half = odd && p == n_pairs - 1;
    // Prefetch this pair's share of the next tile's rows.
    for (int64_t l = p * pf_lines; l < (p + 1) * pf_lines; ++l)
      _mm_prefetch(reinterpret_cast<const char*>(base + 16 * rb + 64 * l), _MM_HINT_T0);
    __m512i g[16];
    tile_codes<T>(base, offs, p, half, g);
    __m512 dw[4], mw[4];
    tile_scales<T>(base, rows_v, p, half, dw, mw);
    for (int64_t n = 0; n < N; ++n) {
      const XPair& a = x[n][p];
      __m512i part[4][2];
      for (int u = 0; u < U; ++u) {
        part[u][0] = Tr::ti.shift ? _mm512_set1_epi32(-(a.s[u] * (1 << Tr::ti.shift))) : _mm512_setzero_si512();
        part[u][1] = _mm512_setzero_si512();
      }
      // Activation groups are broadcast straight from memory (vpdpbusd's {1to16} operand).
      using i32_alias = int32_t __attribute__((may_alias));
      const auto* q4 = reinterpret_cast<const i32_alias*>(a.q);
      for (int j = 0; j < 16; ++j) {
        const int u = unit_of_group(Tr::ti.layout, j);
        part[u][j & 1] = _mm512_dpbusd_epi32(part[u][j & 1], g[j], _mm512_set1_epi32(q4[j]));
      }
      __m512 s = _mm512_load_ps(acc + 32 * n), sm = _mm512_load_ps(acc + 32 * n + 16);
      for (int u = 0; u < U; ++u) {
        const __m512i i = _mm512_add_epi32(part[u][0], part[u][1]);
        s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(dw[u], _mm512_set1_ps(a.dx[u])), s);
        if constexpr (Tr::ti.float_min) sm = _mm512_fmadd_ps(mw[u], _mm512_set1_ps(a.sdx[u]), sm);
      }
      _mm512_store_ps(acc + 32 * n, s);
      _mm512_store_ps(acc + 32 * n + 16, sm);
    }
  }
  for (int64_t n = 0; n < N; ++n) {
    alignas(64) float out[16];
    _mm512_store_ps(out, _mm512_add_ps(_mm512_load_ps(acc + 32 * n), _mm512_load_ps(acc + 32 * n + 16)));
    std::memcpy(y + n * ldy, out, sizeof(float) * rows);
  }
}

using UnitFn = void (*)(const QMatrix&, int64_t, int, const XPair* const*, int64_t, int64_t, float*, int64_t,
                        float*);

UnitFn unit_fn(GGMLType t) {
  switch (t) {
    case GGMLType::Q8_0: return tile16<GGMLType::Q8_0>;
    case GGMLType::Q4_0: return tile16<GGMLType::Q4_0>;
    case GGMLType::Q4_1: return tile16<GGMLType::Q4_1>;
    case GGMLType::Q5_0: return tile16<GGMLType::Q5_0>;
    case GGMLType::Q4_K: return tile16<GGMLType::Q4_K>;
    case GGMLType::Q6_K: return tile16<GGMLType::Q6_K>;
    default: return nullptr;
  }
}

void unit_portable(const QMatrix& W, int64_t r0, int rows, const XPair* const* x, int64_t N, int64_t n_blocks32,
                   float* y, int64_t ldy) {
  for (int64_t n = 0; n < N; ++n)
    for (int r = 0; r < rows; ++r) y[n * ldy + r] = dot_portable(W.type, W.row(r0 + r), n_blocks32, x[n]);
}

}  // namespace

bool has_avx512vnni() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
                         __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512bitalg") && __builtin_cpu_supports("f16c");
  return ok;
}

bool quant_supported(GGMLType t) {
  switch (t) {
    case GGMLType::Q8_0: case GGMLType::Q4_0: case GGMLType::Q4_1: case GGMLType::Q5_0:
    case GGMLType::Q4_K: case GGMLType::Q6_K: return true;
    default: return false;
  }
}

// ---- QMatrix ---------------------------------------------------------------------------

int64_t QMatrix::row_bytes() const {
  const TypeInfo ti = type_info(type);
  return cols / ti.block_elems * ti.block_bytes;
}

QMatrix QMatrix::slice_rows(int64_t r0, int64_t n) const {
  if (r0 < 0 || n < 0 || r0 + n > rows)
    throw InvalidArgument("QMatrix::slice_rows: rows [" + std::to_string(r0) + ", " + std::to_string(r0 + n) +
                          ") outside [0, " + std::to_string(rows) + ")");
  QMatrix s = *this;
  s.rows = n;
  s.data = row(r0);
  return s;
}

QMatrix QMatrix::gather_rows(const std::vector<int64_t>& ids) const {
  const int64_t rb = row_bytes();
  auto buf = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(rb) * ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= rows)
      throw InvalidArgument("QMatrix::gather_rows: row " + std::to_string(ids[i]) + " outside [0, " +
                            std::to_string(rows) + ")");
    std::memcpy(buf->data() + i * rb, row(ids[i]), static_cast<size_t>(rb));
  }
  QMatrix g;
  g.type = type;
  g.rows = static_cast<int64_t>(ids.size());
  g.cols = cols;
  g.data = buf->data();
  g.owner = std::shared_ptr<const void>(buf, buf.get());
  return g;
}

void QMatrix::dequantize_row(int64_t r, float* out) const {
  io::dequantize_to_f32(static_cast<uint32_t>(type), row(r), out, cols);
}

QMatrix qmatrix_from_gguf(const io::GGUFTensorInfo& t) {
  const auto shape = t.shape();
  if (!quant_supported(t.type()))
    throw FormatError("tensor '" + t.name + "' has type " + io::ggml_type_name(t.type_id) +
                      ", which the quantized kernels do not support (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K)");
  if (shape.size() != 2)
    throw FormatError("tensor '" + t.name + "' is not a matrix (" + std::to_string(shape.size()) + " dims)");
  const TypeInfo ti = type_info(t.type());
  QMatrix m;
  m.type = t.type();
  m.rows = shape[0];
  m.cols = shape[1];
  m.data = t.data;
  if (m.cols % ti.block_elems != 0 || m.cols % 32 != 0)
    throw FormatError("tensor '" + t.name + "': row length " + std::to_string(m.cols) +
                      " is not a whole number of " + io::ggml_type_name(t.type_id) + " blocks");
  if (static_cast<uint64_t>(m.row_bytes() * m.rows) > t.n_bytes)
    throw FormatError("tensor '" + t.name + "' is shorter than its shape needs");
  return m;
}

int64_t QLinear::rows() const {
  int64_t n = 0;
  for (const auto& p : parts) n += p.rows;
  return n;
}

// ---- activations ------------------------------------------------------------------------

namespace {

float fp16_round(float v) { return static_cast<float>(c10::Half(v)); }

// ggml's nearest_int: round half to even via the 1.5 * 2^23 trick.
int nearest_int(float v) {
  const float f = v + 12582912.f;
  int32_t i;
  std::memcpy(&i, &f, 4);
  return (i & 0x007fffff) - 0x00400000;
}

// Codes and one scale per 32 values as ggml's Q8_0 / Q8_1 rows: code =
// round(x · 127 / max|x|) (ties to even), d = max|x| / 127 (returned
// unrounded; the rows keep it as binary16).
void quantize32_portable(const float* v, int8_t* codes, float& d) {
  float amax = 0.f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
  const float id = amax != 0.f ? 127.f / amax : 0.f;
  for (int j = 0; j < 32; ++j) codes[j] = static_cast<int8_t>(std::nearbyint(v[j] * id));
  d = amax / 127.f;
}

// The same operations on AVX-512 (vcvtps2dq rounds to nearest even like
// nearbyint in the default rounding mode), so the codes are identical.
__attribute__((target("avx512f,avx512bw"))) void quantize32_avx512(const float* v, int8_t* codes, float& d) {
  const __m512 a = _mm512_loadu_ps(v), b = _mm512_loadu_ps(v + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  const __m512 id = _mm512_set1_ps(amax != 0.f ? 127.f / amax : 0.f);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(codes), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(a, id))));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 16),
                   _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(b, id))));
  d = amax / 127.f;
}

void quantize32(const float* v, int8_t* codes, float& d) {
  static const bool fast = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  if (fast) quantize32_avx512(v, codes, d);
  else quantize32_portable(v, codes, d);
}

// Codes and one scale per 256 values as ggml's Q8_K rows: the value of
// largest magnitude maps to -127, d = 1 / iscale in fp32.
void quantize256(const float* v, int8_t* codes, float& d) {
  float amax = 0.f, max = 0.f;
  for (int j = 0; j < 256; ++j)
    if (std::fabs(v[j]) > amax) {
      amax = std::fabs(v[j]);
      max = v[j];
    }
  if (amax == 0.f) {
    std::fill(codes, codes + 256, int8_t{0});
    d = 0.f;
    return;
  }
  const float iscale = -127.f / max;
  for (int j = 0; j < 256; ++j) codes[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * v[j])));
  d = 1.f / iscale;
}

}  // namespace

QActivations::QActivations(const float* x, int64_t N, int64_t K, const QLinear& layer)
    : n_(N), k_(K), n_pairs_((K / 32 + 1) / 2) {
  if (K <= 0 || K % 32 != 0)
    throw InvalidArgument("qlinear: inner dimension " + std::to_string(K) + " is not a positive multiple of 32");
  bool need[kLayouts] = {false, false, false, false};
  for (const auto& p : layer.parts) {
    const TypeInfo ti = type_info(p.type);
    if (K % ti.block_elems != 0)
      throw InvalidArgument("qlinear: inner dimension " + std::to_string(K) + " is not a whole number of " +
                            io::ggml_type_name(static_cast<uint32_t>(p.type)) + " blocks");
    need[ti.layout] = true;
  }
  const int64_t nb = K / 32;
  std::vector<int8_t> codes(static_cast<size_t>(n_pairs_ * 64));
  std::vector<float> dx(static_cast<size_t>(n_pairs_ * 2));
  for (int l = 0; l < kLayouts; ++l)
    if (need[l]) buf_[l].assign(static_cast<size_t>(N * n_pairs_ * kPairBytes), 0);
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * K;
    for (int k256 = 0; k256 < 2; ++k256) {
      const bool wide = k256 == 1;
      if (!(wide ? need[kNatural32K] || need[kNatural16K] : need[kNatural32] || need[kNibble32])) continue;
      std::fill(codes.begin(), codes.end(), 0);
      std::fill(dx.begin(), dx.end(), 0.f);
      if (wide) {
        for (int64_t b = 0; b < K / 256; ++b) {
          quantize256(xr + b * 256, codes.data() + b * 256, dx[8 * b]);
          for (int i = 1; i < 8; ++i) dx[8 * b + i] = dx[8 * b];
        }
      } else {
        for (int64_t b = 0; b < nb; ++b) quantize32(xr + b * 32, codes.data() + b * 32, dx[b]);
      }
      for (int l = 0; l < kLayouts; ++l) {
        const Layout lay = static_cast<Layout>(l);
        if (!need[l] || per256(lay) != wide) continue;
        const int U = units_of(lay), per_unit = 64 / U;
        auto* pairs = reinterpret_cast<XPair*>(buf_[l].data() + n * n_pairs_ * kPairBytes);
        for (int64_t p = 0; p < n_pairs_; ++p) {
          XPair& a = pairs[p];
          const int8_t* c = codes.data() + p * 64;
          for (int e = 0; e < 64; ++e) a.q[byte_of(lay, e)] = c[e];
          for (int u = 0; u < U; ++u) {
            int32_t sum = 0;
            for (int e = u * per_unit; e < (u + 1) * per_unit; ++e) sum += c[e];
            const float d = dx[static_cast<size_t>(2 * p + (u * per_unit) / 32)];
            a.s[u] = sum;
            // Q8_0 / Q8_1 keep d and d·Σq as binary16; Q8_K keeps d in fp32.
            a.dx[u] = wide ? d : fp16_round(d);
            a.sdx[u] = wide ? d * static_cast<float>(sum) : fp16_round(d * static_cast<float>(sum));
          }
        }
      }
    }
  }
}

const uint8_t* QActivations::pairs(int layout, int64_t n) const {
  return buf_[layout].data() + n * n_pairs_ * kPairBytes;
}

// ---- qlinear ------------------------------------------------------------------------------

void qlinear(const QActivations& x, const QLinear& layer, float* y, int64_t ldy, QKernel kernel) {
  const int64_t N = x.n(), K = x.k(), O = layer.rows();
  if (K != layer.cols())
    throw InvalidArgument("qlinear: activations have " + std::to_string(K) + " columns, the weights " +
                          std::to_string(layer.cols()));
  if (ldy < O) throw InvalidArgument("qlinear: output row stride " + std::to_string(ldy) + " < " + std::to_string(O));
  if (N == 0 || O == 0) return;
  if (kernel == QKernel::Avx512Vnni && !has_avx512vnni())
    throw InvalidArgument("qlinear: this CPU lacks AVX512-VNNI");
  const bool fast = kernel == QKernel::Avx512Vnni || (kernel == QKernel::Auto && has_avx512vnni());

  // Work units: 16 output rows of one part.
  struct Unit {
    const QMatrix* m;
    int64_t r0, out0;
    int rows;
    int layout;
  };
  std::vector<Unit> units;
  int64_t out0 = 0;
  for (const auto& part : layer.parts) {
    if (part.cols != K) throw InvalidArgument("qlinear: parts of one layer must have the same column count");
    const int lay = type_info(part.type).layout;
    for (int64_t r = 0; r < part.rows; r += 16)
      units.push_back({&part, r, out0 + r, static_cast<int>(std::min<int64_t>(16, part.rows - r)), lay});
    out0 += part.rows;
  }
  const int64_t n_blocks32 = K / 32;
  std::vector<const XPair*> xp[kLayouts];
  for (const auto& un : units) {
    auto& v = xp[un.layout];
    if (!v.empty()) continue;
    v.resize(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) v[n] = reinterpret_cast<const XPair*>(x.pairs(un.layout, n));
  }
  // Activation rows in chunks: a chunk's pairs stay in L2 while every unit reads them.
  const int64_t chunk = std::clamp<int64_t>((256 * 1024) / ((K / 64 + 1) * kPairBytes), 1, 64);
  const int64_t unit_bytes = 16 * layer.parts.front().row_bytes();
  const int64_t grain = std::max<int64_t>(1, (32 * 1024) / std::max<int64_t>(1, unit_bytes));
  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    const int64_t nn = std::min(chunk, N - n0);
    at::parallel_for(0, static_cast<int64_t>(units.size()), grain, [&](int64_t u0, int64_t u1) {
      std::vector<float> acc_buf(fast ? static_cast<size_t>(32 * nn + 16) : 0);
      float* acc = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(acc_buf.data()) + 63) & ~uintptr_t{63});
      for (int64_t u = u0; u < u1; ++u) {
        const Unit& un = units[u];
        const XPair* const* xs = xp[un.layout].data() + n0;
        float* yu = y + n0 * ldy + un.out0;
        if (fast) unit_fn(un.m->type)(*un.m, un.r0, un.rows, xs, nn, n_blocks32, yu, ldy, acc);
        else unit_portable(*un.m, un.r0, un.rows, xs, nn, n_blocks32, yu, ldy);
      }
    });
  }
}

void qlinear(const float* x, int64_t N, const QLinear& layer, float* y, int64_t ldy, QKernel kernel) {
  const QActivations xq(x, N, layer.cols(), layer);
  qlinear(xq, layer, y, ldy, kernel);
}

}  // namespace dspark::ops
