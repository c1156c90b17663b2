// qgemm.inl — AVX2 quantized tiles on packed weights (internal; included by
// qgemm.cpp with kVnni = false and by qgemm_vnni.cpp with kVnni = true,
// inside the level's namespace and `#pragma GCC target`; qgemm_vnni_evex.cpp
// builds the VNNI variant with AVX-512's encoding of the same instruction so
// that CPUs without AVX-VNNI can check it).
//
// A 16-row tile (src/ops/qpack.hpp) is computed as two halves of 8 rows, one
// row per 32-bit lane. Activation rows go in register blocks of up to 4, each
// row's accumulators in registers for the whole half. For each fold unit, each
// code group (group g: 4 codes of each of the 8 rows) is unpacked into a
// register where the block's rows use it: the 4 activation codes of group g
// are broadcast and multiplied into each lane's 4 codes, and the unit's
// products summed exactly in int32 per lane —
//   without VNNI: vpmaddubsw (u8 x s8 -> pairs in s16) summed in s16 while no
//     sum can overflow (up to 8 groups of 4-bit codes, 4 of 5-bit, 2 of
//     6-bit), then vpmaddwd by 1 into int32; Q8_0 codes are signed, so it
//     multiplies |w| by x·sign(w) (|w| <= 128, pairs <= 32512);
//   with AVX-VNNI: vpdpbusd accumulates each group straight into int32
//     (Q8_0 as unsigned q = w + 128 less 128·Σx).
// The fold of each unit then runs for the 8 rows at once, with qmatmul.hpp's
// operations: acc = acc + I·(dw·dx), accm = accm + mw·(dx·s).

#ifndef DSPARK_DPBUSD256
#define DSPARK_DPBUSD256 _mm256_dpbusd_avx_epi32
#endif

namespace {

using detail::kQTypeInfo;
using detail::QType;
using detail::XPair;

inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m256 half8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m256 u8x8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m256 s8x8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m256 negate(__m256 v) { return _mm256_xor_ps(v, _mm256_set1_ps(-0.f)); }
inline __m256i bcast_group(const XPair& a, int g) {
  int32_t v;
  std::memcpy(&v, a.q + 4 * g, 4);
  return _mm256_set1_epi32(v);
}
// An empty asm that the sum must pass through in a register: keeps GCC
// from re-associating a row's chain of adds into a tree whose products all
// stay live at once (spilled to the stack with four rows in flight).
inline void keep_in_register(__m256i& v) { asm("" : "+x"(v)); }
inline __m256i lo_nibbles(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
inline __m256i hi_nibbles(__m256i v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }

// Bit j of every byte of h, moved to bit 4 (Q5_0's fifth bits).
inline __m256i bit_to_16(__m256i h, int j) {
  const __m256i m = _mm256_set1_epi8(0x10);
  return j <= 4 ? _mm256_and_si256(_mm256_sll_epi16(h, _mm_cvtsi32_si128(4 - j)), m)
                : _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(j - 4)), m);
}
// Bits 2m..2m+1 of every byte of h, moved to bits 4-5 (Q6_K's high bits).
inline __m256i bits_to_48(__m256i h, int m) {
  const __m256i k = _mm256_set1_epi8(0x30);
  return m <= 2 ? _mm256_and_si256(_mm256_sll_epi16(h, _mm_cvtsi32_si128(4 - 2 * m)), k)
                : _mm256_and_si256(_mm256_srli_epi16(h, 2), k);
}

// One fold unit of 8 rows: where its code groups are (chunk, pair, unit,
// half) and its scales. Each group's codes are unpacked by code() where the
// sums use them, so that no more than one or two groups are in registers
// beside the activation rows' accumulators.
struct Unit {
  const uint8_t* ch;
  int j, u, r8;  // pair within the chunk, unit, byte offset of the half in a [16 rows][4] array
  __m256 dw, mw;
};

// Code groups per fold unit.
template <QType T>
constexpr int kGroups = T == detail::kQ6_K ? 4 : 8;

// Slot i of a unit's code groups: the codes (unsigned; Q8_0 without VNNI:
// |w|) and the activation group they multiply. Nibble types hold slots i and
// i + 4 in the low and high nibbles of one packed dword array.
template <QType T>
inline __m256i code(const Unit& w, int i) {
  if constexpr (T == detail::kQ8_0) {
    const __m256i c = load32(w.ch + (8 * w.u + i) * 64 + w.r8);
    return kVnni ? _mm256_xor_si256(c, _mm256_set1_epi8(static_cast<char>(0x80))) : _mm256_sign_epi8(c, c);
  } else if constexpr (T == detail::kQ4_0 || T == detail::kQ4_1 || T == detail::kQ5_0) {
    const __m256i P = load32(w.ch + (4 * w.u + i % 4) * 64 + w.r8);
    const __m256i c = i < 4 ? lo_nibbles(P) : hi_nibbles(P);
    if constexpr (T == detail::kQ5_0)
      return _mm256_or_si256(c, bit_to_16(load32(w.ch + (i < 4 ? 512 : 576) + w.r8), 4 * w.u + i % 4));
    return c;
  } else if constexpr (T == detail::kQ4_K) {
    const __m256i P = load32(w.ch + 320 + w.j * 512 + i * 64 + w.r8);
    return w.u == 0 ? lo_nibbles(P) : hi_nibbles(P);
  } else {
    static_assert(T == detail::kQ6_K);
    const uint8_t* pj = w.ch + 288 + w.j * 768;
    const __m256i P = load32(pj + (4 * (w.u % 2) + i) * 64 + w.r8);
    return _mm256_or_si256(w.u < 2 ? lo_nibbles(P) : hi_nibbles(P), bits_to_48(load32(pj + 512 + w.u * 64 + w.r8), i));
  }
}
template <QType T>
inline int group(const Unit& w, int i) {
  if constexpr (T == detail::kQ4_0 || T == detail::kQ4_1 || T == detail::kQ5_0)
    return i < 4 ? 4 * w.u + i : 8 + 4 * w.u + i - 4;
  else
    return kGroups<T> * w.u + i;
}
// Order of the slots in the sums: a nibble array's two slots one after the
// other. Integer sums are exact, so any order gives the same bits.
template <QType T>
constexpr int slot(int k) {
  if constexpr (T == detail::kQ4_0 || T == detail::kQ4_1 || T == detail::kQ5_0)
    return k % 2 == 0 ? k / 2 : 4 + k / 2;
  else
    return k;
}

// Σ over the unit's groups of the 4 products per lane, exactly in int32, for
// kR activation rows at once (s[r] for row x[r][p]): each group's codes are
// used by every row while in a register, and the rows' chains are
// independent.
template <QType T, int kR>
inline void unit_sums(const Unit& w, const XPair* const* x, int64_t p, __m256i* s) {
  constexpr int kN = kGroups<T>;
  for (int r = 0; r < kR; ++r) s[r] = _mm256_setzero_si256();
  if constexpr (kVnni) {
#pragma GCC unroll 8
    for (int k = 0; k < kN; ++k) {
      const int i = slot<T>(k);
      const __m256i c = code<T>(w, i);
      for (int r = 0; r < kR; ++r) s[r] = DSPARK_DPBUSD256(s[r], c, bcast_group(x[r][p], group<T>(w, i)));
    }
  } else if constexpr (T == detail::kQ8_0) {
    // Signed codes: |w| times x·sign(w) (|w| <= 128, pairs <= 32512).
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 8
    for (int i = 0; i < kN; ++i) {
      const __m256i c = code<T>(w, i), sg = load32(w.ch + (8 * w.u + i) * 64 + w.r8);
      for (int r = 0; r < kR; ++r) {
        const __m256i sx = _mm256_sign_epi8(bcast_group(x[r][p], group<T>(w, i)), sg);
        s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(_mm256_maddubs_epi16(c, sx), ones));
      }
    }
  } else {
    // Groups per s16 sum: |pair| <= 2·(2^bits - 1)·127 must stay below 2^15.
    constexpr int kBits = T == detail::kQ5_0 ? 5 : T == detail::kQ6_K ? 6 : 4;
    constexpr int per = kBits == 4 ? 8 : kBits == 5 ? 4 : 2;
    static_assert(kN % per == 0);
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 8
    for (int k0 = 0; k0 < kN; k0 += per) {
      __m256i s16[kR] = {};
#pragma GCC unroll 8
      for (int q = 0; q < per; ++q) {
        const int k = k0 + q, i = slot<T>(k);
        const __m256i c = code<T>(w, i);
        for (int r = 0; r < kR; ++r) {
          const __m256i prod = _mm256_maddubs_epi16(c, bcast_group(x[r][p], group<T>(w, i)));
          s16[r] = q == 0 ? prod : _mm256_add_epi16(s16[r], prod);
          keep_in_register(s16[r]);
        }
      }
      for (int r = 0; r < kR; ++r) s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(s16[r], ones));
    }
  }
}

// Unit u of pair j (within its chunk `ch`) for rows 8h..8h+7: where its
// codes are, and its scales.
template <QType T>
inline void load_unit(const uint8_t* ch, int j, int u, int h, Unit& w) {
  w.ch = ch;
  w.j = j;
  w.u = u;
  w.r8 = 32 * h;
  if constexpr (T == detail::kQ8_0) {
    w.dw = half8(ch + 1024 + (u * 16 + 8 * h) * 2);
  } else if constexpr (T == detail::kQ4_0 || T == detail::kQ4_1 || T == detail::kQ5_0) {
    const int64_t sc = T == detail::kQ5_0 ? 640 : 512;
    w.dw = half8(ch + sc + (u * 16 + 8 * h) * 2);
    if constexpr (T == detail::kQ4_1) w.mw = half8(ch + sc + 64 + (u * 16 + 8 * h) * 2);
  } else if constexpr (T == detail::kQ4_K) {
    const int k = 2 * j + u;
    w.dw = _mm256_mul_ps(half8(ch + 16 * h), u8x8(ch + 64 + k * 16 + 8 * h));
    w.mw = negate(_mm256_mul_ps(half8(ch + 32 + 16 * h), u8x8(ch + 192 + k * 16 + 8 * h)));
  } else {
    static_assert(T == detail::kQ6_K);
    w.dw = _mm256_mul_ps(half8(ch + 16 * h), s8x8(ch + 32 + (4 * j + u) * 16 + 8 * h));
  }
}

// Bytes of weights prefetched ahead of the chunk computed: the hardware
// prefetchers alone leave a one-row decode step waiting on memory. Into L2
// (T2), not L1: the tile being computed and its activation rows stay in L1
// (on Zen 4, one thread, the 262144x640 Q8_0 head streamed at 12-13 GB/s
// with T0 against 22-28 GB/s with T2).
constexpr int64_t kAheadBytes = 6144;

// Unit u's integer sums I with activation row a folded into the row's
// accumulators (acc: the scaled integer sums; accm: Q4_1 / Q4_K's minimum
// terms).
template <QType T>
inline void fold(const Unit& w, __m256i I, const XPair& a, int u, __m256& acc, __m256& accm) {
  constexpr auto ti = kQTypeInfo[T];
  constexpr int shift = kVnni && T == detail::kQ8_0 ? 7 : T == detail::kQ8_0 ? 0 : ti.shift;
  if constexpr (shift != 0) I = _mm256_sub_epi32(I, _mm256_set1_epi32(a.s[u] * (1 << shift)));
  acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(I), _mm256_mul_ps(w.dw, _mm256_set1_ps(a.dx[u]))));
  if constexpr (ti.float_min) accm = _mm256_add_ps(accm, _mm256_mul_ps(w.mw, _mm256_set1_ps(a.sdx[u])));
}

// Walks rows 8h..8h+7 of the tile unit by unit: f(unit, pair, unit index)
// for every fold unit, in the one order all paths share; half 0 streams the
// tile in (prefetch).
template <QType T, typename F>
__attribute__((always_inline)) inline void for_each_unit(const detail::QTile& t, int64_t n_blocks32, int h, F&& f) {
  constexpr int U = detail::units_of(kQTypeInfo[T].layout);
  constexpr bool kK = T == detail::kQ4_K || T == detail::kQ6_K;
  constexpr int pairs_per_chunk = kK ? 4 : 1;
  const int64_t n_pairs = (n_blocks32 + 1) / 2, chunks = n_pairs / pairs_per_chunk;
  const bool odd = n_blocks32 % 2 != 0;
  const int64_t cb = detail::chunk_bytes(T), ahead = (kAheadBytes + cb - 1) / cb * cb;
  for (int64_t c = 0; c < chunks; ++c) {
    const uint8_t* ch = t.packed + c * cb;
    if (h == 0)
      for (int64_t b = 0; b < cb; b += 64) _mm_prefetch(reinterpret_cast<const char*>(ch + ahead + b), _MM_HINT_T2);
    for (int j = 0; j < pairs_per_chunk; ++j) {
      const int64_t p = c * pairs_per_chunk + j;
      const int units = odd && p == n_pairs - 1 ? U / 2 : U;
      for (int u = 0; u < units; ++u) {
        Unit w;
        load_unit<T>(ch, j, u, h, w);
        f(w, p, u);
      }
    }
  }
}

// Stores one activation row's sums for rows 8h..8h+7 of the tile (fewer at
// its end) to yr[0..].
inline void store_half(const detail::QTile& t, int h, __m256 s, float* yr) {
  const int rows = t.rows - 8 * h < 8 ? t.rows - 8 * h : 8;
  if (rows == 8) {
    _mm256_storeu_ps(yr, s);
  } else {
    alignas(32) float o[8];
    _mm256_store_ps(o, s);
    for (int r = 0; r < rows; ++r) yr[r] = o[r];
  }
}

// Rows 8h..8h+7 of the tile for kR <= kMaxBlock activation rows, their
// accumulators in registers for the whole half; more rows take more blocks,
// each walking the tile (from L1 after the first). On Zen 4 at this level,
// one thread, against the earlier scheme (codes of a unit unpacked into 8
// registers once for all rows, blocks of up to 4 rows, more rows' accumulators
// round-tripping through L1 every unit): SmolLM2's 1536x576 Q4_1 ffn_up 0.046
// -> 0.038 ms for 4 rows and 0.091 -> 0.075 for 8, Gemma 3's 640x2048 Q6_K
// ffn_down 0.077 -> 0.064 and 0.145 -> 0.124; blocks of 3 were slower at 4
// and 8 rows (0.043, 0.079; 0.075, 0.136).
constexpr int kMaxBlock = 4;

template <QType T, int kR>
void rows_block(const detail::QTile& t, const XPair* const* x, int64_t n_blocks32, float* y, int64_t ldy, int h) {
  constexpr bool kMin = kQTypeInfo[T].float_min;
  __m256 acc[kR], accm[kR];
  for (int r = 0; r < kR; ++r) acc[r] = accm[r] = _mm256_setzero_ps();
  for_each_unit<T>(t, n_blocks32, h, [&](const Unit& w, int64_t p, int u) {
    __m256i I[kR];
    unit_sums<T, kR>(w, x, p, I);
    for (int r = 0; r < kR; ++r) fold<T>(w, I[r], x[r][p], u, acc[r], accm[r]);
  });
  for (int r = 0; r < kR; ++r) store_half(t, h, kMin ? _mm256_add_ps(acc[r], accm[r]) : acc[r], y + r * ldy + 8 * h);
}

// Every lane sees the same operations in the same order on either path.
template <QType T>
void tile(const detail::QTile& t, const XPair* const* x, int64_t N, int64_t n_blocks32, float* y, int64_t ldy,
          float* /*scratch*/) {
  for (int h = 0; h < (t.rows > 8 ? 2 : 1); ++h) {
    int64_t n = 0;
    for (; N - n >= kMaxBlock; n += kMaxBlock) rows_block<T, kMaxBlock>(t, x + n, n_blocks32, y + n * ldy, ldy, h);
    switch (N - n) {
      case 1: rows_block<T, 1>(t, x + n, n_blocks32, y + n * ldy, ldy, h); break;
      case 2: rows_block<T, 2>(t, x + n, n_blocks32, y + n * ldy, ldy, h); break;
      case 3: rows_block<T, 3>(t, x + n, n_blocks32, y + n * ldy, ldy, h); break;
      default: break;
    }
  }
}

}  // namespace

DSPARK_DEFINE_QTILES(tile)
