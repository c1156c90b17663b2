// AVX-512 level: quantized tiles with vpdpbusd, straight from the GGUF rows
// (include/dspark/ops/qmatmul.hpp for the arithmetic).
//
// A tile is 16 weight rows x one pair: each row's 64 codes are unpacked into
// a zmm register, and the 16 registers are transposed so that register j
// holds code group j (4 bytes) of all 16 rows, one row per lane. `vpdpbusd`
// of register j with activation group j broadcast adds that group's 4
// products into each row's lane, so a lane sums its row's unit exactly in
// int32; the unit's fp32 fold step then runs for 16 rows at once, with the
// reference's operations (a multiply, then an add).
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#pragma GCC diagnostic push
// GCC 12's AVX-512 headers trip -Wuninitialized inside their own shuffle
// intrinsics (the "undefined" pass-through operand); the code here is fine.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "../../../level_kernels.hpp"
#include "../../../qformat.hpp"
#include "dspark/io/gguf.hpp"

namespace dspark::ops::avx512 {

namespace {

using detail::kQTypeInfo;
using detail::XPair;
using io::GGMLType;

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

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
      mw[b] = _mm512_xor_ps(_mm512_mul_ps(dmin, mn), _mm512_set1_ps(-0.f));
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
  static constexpr detail::QTypeInfo ti = kQTypeInfo[detail::qtype_of(T)];
  static constexpr int U = detail::units_of(ti.layout);
};

// Up to 16 weight rows (r0..r0+rows-1) against N activation rows:
// y[n * ldy + r] for r < rows. Missing rows repeat row r0 (results dropped).
template <GGMLType T>
DSPARK_VNNI void tile16(const detail::QTile& t, const XPair* const* x, int64_t N, int64_t n_blocks32, float* y,
                        int64_t ldy, float* acc) {
  using Tr = Traits<T>;
  constexpr int U = Tr::U;
  const int64_t n_pairs = (n_blocks32 + 1) / 2;
  const bool odd = n_blocks32 % 2 != 0;
  const int rows = t.rows;
  const int64_t rb = t.row_bytes;
  const uint8_t* base = t.raw;
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
        const int u = detail::unit_of_group(Tr::ti.layout, j);
        part[u][j & 1] = _mm512_dpbusd_epi32(part[u][j & 1], g[j], _mm512_set1_epi32(q4[j]));
      }
      __m512 s = _mm512_load_ps(acc + 32 * n), sm = _mm512_load_ps(acc + 32 * n + 16);
      for (int u = 0; u < (half ? U / 2 : U); ++u) {
        const __m512i i = _mm512_add_epi32(part[u][0], part[u][1]);
        s = _mm512_add_ps(s, _mm512_mul_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(dw[u], _mm512_set1_ps(a.dx[u]))));
        if constexpr (Tr::ti.float_min) sm = _mm512_add_ps(sm, _mm512_mul_ps(mw[u], _mm512_set1_ps(a.sdx[u])));
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

template <detail::QType Q>
void tile_q(const detail::QTile& t, const XPair* const* x, int64_t N, int64_t n_blocks32, float* y, int64_t ldy,
            float* acc) {
  tile16<kQTypeInfo[Q].ggml>(t, x, N, n_blocks32, y, ldy, acc);
}

}  // namespace

DSPARK_DEFINE_QTILES(tile_q)

}  // namespace dspark::ops::avx512
