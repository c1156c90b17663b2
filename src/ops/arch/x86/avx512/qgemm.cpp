// AVX-512 level: quantized tiles on packed weights with the 512-bit vpdpbusd
// (include/dspark/ops/qmatmul.hpp for the arithmetic, src/ops/qpack.hpp for
// the tile layout).
//
// A packed code group is 16 rows x 4 bytes: one zmm register, one row per
// 32-bit lane, with no transpose. For each fold unit the unit's groups are
// unpacked once and used for a block of up to 6 activation rows, whose
// accumulators stay in registers for the whole tile (ik_llama.cpp's
// iqk_mul_mat keeps several rows' sums in registers the same way); a block
// of activation rows reads the tile's weights from L1 after the first. Each
// unit's products are summed exactly in int32 per lane (two interleaved
// vpdpbusd chains, then one add), then folded with qmatmul.hpp's operations,
// in the same order as every other level:
//   acc = acc + I·(dw·dx),  accm = accm + mw·(dx·s),  y = acc + accm.
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
#include "../../../qpack.hpp"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c")

namespace dspark::ops::avx512 {

namespace {

using detail::kQTypeInfo;
using detail::QType;
using detail::XPair;

inline __m512i load64(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline __m512 half16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 u8x16(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline __m512 s8x16(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline __m512 negate(__m512 v) { return _mm512_xor_ps(v, _mm512_set1_ps(-0.f)); }
inline __m512i bcast_group(const XPair& a, int g) {
  int32_t v;
  std::memcpy(&v, a.q + 4 * g, 4);
  return _mm512_set1_epi32(v);
}
inline __m512i lo_nibbles(__m512i v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
inline __m512i hi_nibbles(__m512i v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }

// Bit j of every byte of h, moved to bit 4 (Q5_0's fifth bits).
inline __m512i bit_to_16(__m512i h, int j) {
  const __m512i m = _mm512_set1_epi8(0x10);
  return j <= 4 ? _mm512_and_si512(_mm512_sll_epi16(h, _mm_cvtsi32_si128(4 - j)), m)
                : _mm512_and_si512(_mm512_srl_epi16(h, _mm_cvtsi32_si128(j - 4)), m);
}
// Bits 2m..2m+1 of every byte of h, moved to bits 4-5 (Q6_K's high bits).
inline __m512i bits_to_48(__m512i h, int m) {
  const __m512i k = _mm512_set1_epi8(0x30);
  return m <= 2 ? _mm512_and_si512(_mm512_sll_epi16(h, _mm_cvtsi32_si128(4 - 2 * m)), k)
                : _mm512_and_si512(_mm512_srli_epi16(h, 2), k);
}

// One fold unit of the tile's 16 rows: its unsigned code groups (codes[i]
// holds activation group groups[i]) and its scales.
struct Unit {
  __m512i codes[8];
  int groups[8];
  __m512 dw, mw;
};

template <QType T>
constexpr int kGroups = T == detail::kQ6_K ? 4 : 8;

// Unit u of pair j of chunk `ch`: codes and scales (qpack.hpp's layout).
template <QType T>
inline void load_unit(const uint8_t* ch, int j, int u, Unit& w) {
  if constexpr (T == detail::kQ8_0) {
    // Unsigned codes w + 128; fold() takes 128·Σx back out.
    for (int i = 0; i < 8; ++i) {
      w.codes[i] = _mm512_xor_si512(load64(ch + (8 * u + i) * 64), _mm512_set1_epi8(static_cast<char>(0x80)));
      w.groups[i] = 8 * u + i;
    }
    w.dw = half16(ch + 1024 + u * 32);
  } else if constexpr (T == detail::kQ4_0 || T == detail::kQ4_1 || T == detail::kQ5_0) {
    for (int i = 0; i < 4; ++i) {
      const __m512i P = load64(ch + (4 * u + i) * 64);
      w.codes[i] = lo_nibbles(P);
      w.codes[4 + i] = hi_nibbles(P);
      w.groups[i] = 4 * u + i;
      w.groups[4 + i] = 8 + 4 * u + i;
    }
    if constexpr (T == detail::kQ5_0) {
      const __m512i H0 = load64(ch + 512), H1 = load64(ch + 576);
      for (int i = 0; i < 4; ++i) {
        w.codes[i] = _mm512_or_si512(w.codes[i], bit_to_16(H0, 4 * u + i));
        w.codes[4 + i] = _mm512_or_si512(w.codes[4 + i], bit_to_16(H1, 4 * u + i));
      }
    }
    constexpr int64_t sc = T == detail::kQ5_0 ? 640 : 512;
    w.dw = half16(ch + sc + u * 32);
    if constexpr (T == detail::kQ4_1) w.mw = half16(ch + sc + 64 + u * 32);
  } else if constexpr (T == detail::kQ4_K) {
    const uint8_t* nib = ch + 320 + j * 512;
    for (int i = 0; i < 8; ++i) {
      const __m512i P = load64(nib + i * 64);
      w.codes[i] = u == 0 ? lo_nibbles(P) : hi_nibbles(P);
      w.groups[i] = 8 * u + i;
    }
    const int k = 2 * j + u;
    w.dw = _mm512_mul_ps(half16(ch), u8x16(ch + 64 + k * 16));
    w.mw = negate(_mm512_mul_ps(half16(ch + 32), u8x16(ch + 192 + k * 16)));
  } else {
    static_assert(T == detail::kQ6_K);
    const uint8_t* pj = ch + 288 + j * 768;
    const __m512i HB = load64(pj + 512 + u * 64);
    for (int i = 0; i < 4; ++i) {
      const __m512i P = load64(pj + (4 * (u % 2) + i) * 64);
      w.codes[i] = _mm512_or_si512(u < 2 ? lo_nibbles(P) : hi_nibbles(P), bits_to_48(HB, i));
      w.groups[i] = 4 * u + i;
    }
    w.dw = _mm512_mul_ps(half16(ch), s8x16(ch + 32 + (4 * j + u) * 16));
  }
}

// Unit u's products with activation row a folded into its accumulators.
template <QType T>
inline void fold(const Unit& w, const XPair& a, int u, __m512& acc, __m512& accm) {
  constexpr auto ti = kQTypeInfo[T];
  constexpr int kN = kGroups<T>;
  __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
  for (int i = 0; i < kN; i += 2) {
    s0 = _mm512_dpbusd_epi32(s0, w.codes[i], bcast_group(a, w.groups[i]));
    s1 = _mm512_dpbusd_epi32(s1, w.codes[i + 1], bcast_group(a, w.groups[i + 1]));
  }
  __m512i I = _mm512_add_epi32(s0, s1);
  constexpr int shift = T == detail::kQ8_0 ? 7 : ti.shift;
  if constexpr (shift != 0) I = _mm512_sub_epi32(I, _mm512_set1_epi32(a.s[u] * (1 << shift)));
  acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(w.dw, _mm512_set1_ps(a.dx[u]))));
  if constexpr (ti.float_min) accm = _mm512_add_ps(accm, _mm512_mul_ps(w.mw, _mm512_set1_ps(a.sdx[u])));
}

// Bytes of weights prefetched ahead of the chunk computed, into L2 (T2) and
// not L1, where the tile being computed and the activation rows stay: on Zen 4
// with T0, the whole Gemma 3 270M verify of 8 tokens took 19.9 ms against
// 13.9-14.9 ms with T2 (one token 9.0-9.8 ms either way).
constexpr int64_t kAheadBytes = 6144;

// The tile for kR activation rows (x[0..kR-1]), their accumulators in
// registers; `prefetch`: the first block of rows streams the tile in.
template <QType T, int kR>
void rows_block(const detail::QTile& t, const XPair* const* x, int64_t n_blocks32, float* y, int64_t ldy,
                bool prefetch) {
  constexpr auto ti = kQTypeInfo[T];
  constexpr int U = detail::units_of(ti.layout);
  constexpr bool kK = T == detail::kQ4_K || T == detail::kQ6_K;
  constexpr int pairs_per_chunk = kK ? 4 : 1;
  const int64_t n_pairs = (n_blocks32 + 1) / 2, chunks = n_pairs / pairs_per_chunk;
  const bool odd = n_blocks32 % 2 != 0;
  const int64_t cb = detail::chunk_bytes(T), ahead = (kAheadBytes + cb - 1) / cb * cb;
  __m512 acc[kR], accm[kR];
  for (int r = 0; r < kR; ++r) acc[r] = accm[r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    const uint8_t* ch = t.packed + c * cb;
    if (prefetch)
      for (int64_t b = 0; b < cb; b += 64) _mm_prefetch(reinterpret_cast<const char*>(ch + ahead + b), _MM_HINT_T2);
    for (int j = 0; j < pairs_per_chunk; ++j) {
      const int64_t p = c * pairs_per_chunk + j;
      const int units = odd && p == n_pairs - 1 ? U / 2 : U;
      for (int u = 0; u < units; ++u) {
        Unit w;
        load_unit<T>(ch, j, u, w);
        for (int r = 0; r < kR; ++r) fold<T>(w, x[r][p], u, acc[r], accm[r]);
      }
    }
  }
  const __mmask16 keep = static_cast<__mmask16>((1u << t.rows) - 1);
  for (int r = 0; r < kR; ++r)
    _mm512_mask_storeu_ps(y + r * ldy, keep, ti.float_min ? _mm512_add_ps(acc[r], accm[r]) : acc[r]);
}

// N activation rows in register blocks of 6 (8 spill on GCC 12 and were
// measured slower), the rest (1..5) as one block: each block unpacks the
// tile's codes once.
template <QType T>
void tile(const detail::QTile& t, const XPair* const* x, int64_t N, int64_t n_blocks32, float* y, int64_t ldy,
          float* /*scratch*/) {
  int64_t n = 0;
  for (; N - n >= 6; n += 6) rows_block<T, 6>(t, x + n, n_blocks32, y + n * ldy, ldy, n == 0);
  const XPair* const* xr = x + n;
  float* yr = y + n * ldy;
  const bool first = n == 0;
  switch (N - n) {
    case 1: rows_block<T, 1>(t, xr, n_blocks32, yr, ldy, first); break;
    case 2: rows_block<T, 2>(t, xr, n_blocks32, yr, ldy, first); break;
    case 3: rows_block<T, 3>(t, xr, n_blocks32, yr, ldy, first); break;
    case 4: rows_block<T, 4>(t, xr, n_blocks32, yr, ldy, first); break;
    case 5: rows_block<T, 5>(t, xr, n_blocks32, yr, ldy, first); break;
    default: break;
  }
}

}  // namespace

DSPARK_DEFINE_QTILES(tile)

}  // namespace dspark::ops::avx512

#pragma GCC pop_options
