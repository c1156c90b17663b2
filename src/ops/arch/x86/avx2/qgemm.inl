// qgemm.inl — AVX2 quantized tiles on packed weights (internal; included by
// qgemm.cpp with kVnni = false and by qgemm_vnni.cpp with kVnni = true,
// inside the level's namespace and `#pragma GCC target`).
//
// A 16-row tile (src/ops/qpack.hpp) is computed as two halves of 8 rows, one
// row per 32-bit lane. For each fold unit, the unit's code groups are
// unpacked once into registers (group g: 4 codes of each of the 8 rows) and
// then used for every activation row: the 4 activation codes of group g are
// broadcast and multiplied into each lane's 4 codes, and the unit's products
// summed exactly in int32 per lane —
//   without VNNI: vpmaddubsw (u8 x s8 -> pairs in s16) summed in s16 while no
//     sum can overflow (up to 8 groups of 4-bit codes, 4 of 5-bit, 2 of
//     6-bit), then vpmaddwd by 1 into int32; Q8_0 codes are signed, so it
//     multiplies |w| by x·sign(w) (|w| <= 128, pairs <= 32512);
//   with AVX-VNNI: vpdpbusd accumulates each group straight into int32
//     (Q8_0 as unsigned q = w + 128 less 128·Σx).
// The fold of each unit then runs for the 8 rows at once, with qmatmul.hpp's
// operations: acc = acc + I·(dw·dx), accm = accm + mw·(dx·s). Up to 4
// activation rows keep their accumulators in registers; more live in
// `scratch` (L1) between units.

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

// One fold unit of 8 rows: its code groups (codes[i] holds activation group
// groups[i]) and its scales.
struct Unit {
  __m256i codes[8];  // unsigned codes (Q8_0 without VNNI: |w|)
  int groups[8];
  const uint8_t* signed_codes;  // Q8_0 without VNNI: group i's codes w at + 64·i
  __m256 dw, mw;
};

// Code groups per fold unit.
template <QType T>
constexpr int kGroups = T == detail::kQ6_K ? 4 : 8;

// Σ over the unit's kN groups of the 4 products per lane, exactly in int32.
// kBits: the largest code width (4, 5, 6; 8 = signed Q8_0 codes).
template <int kBits, int kN>
inline __m256i unit_sum(const Unit& w, const XPair& a) {
  if constexpr (kVnni) {
    __m256i s = _mm256_setzero_si256();
    for (int i = 0; i < kN; ++i) s = _mm256_dpbusd_avx_epi32(s, w.codes[i], bcast_group(a, w.groups[i]));
    return s;
  } else if constexpr (kBits == 8) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s = _mm256_setzero_si256();
    for (int i = 0; i < kN; ++i) {
      const __m256i sx = _mm256_sign_epi8(bcast_group(a, w.groups[i]), load32(w.signed_codes + 64 * i));
      const __m256i p = _mm256_maddubs_epi16(w.codes[i], sx);
      s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
    }
    return s;
  } else {
    // Groups per s16 sum: |pair| <= 2·(2^bits - 1)·127 must stay below 2^15.
    constexpr int per = kBits == 4 ? 8 : kBits == 5 ? 4 : 2;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s = _mm256_setzero_si256();
    for (int i0 = 0; i0 < kN; i0 += per) {
      __m256i s16 = _mm256_maddubs_epi16(w.codes[i0], bcast_group(a, w.groups[i0]));
      for (int i = i0 + 1; i < i0 + per && i < kN; ++i)
        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w.codes[i], bcast_group(a, w.groups[i])));
      s = _mm256_add_epi32(s, _mm256_madd_epi16(s16, ones));
    }
    return s;
  }
}

// Unit u of pair p (within its chunk `ch`) for rows 8h..8h+7: codes and scales.
template <QType T>
inline void load_unit(const uint8_t* ch, int j, int u, int h, Unit& w) {
  const int r8 = 32 * h;  // byte offset of the half within a [16 rows][4] array
  if constexpr (T == detail::kQ8_0) {
    for (int i = 0; i < 8; ++i) {
      const __m256i c = load32(ch + (8 * u + i) * 64 + r8);
      w.codes[i] = kVnni ? _mm256_xor_si256(c, _mm256_set1_epi8(static_cast<char>(0x80))) : _mm256_sign_epi8(c, c);
      w.groups[i] = 8 * u + i;
    }
    w.signed_codes = ch + 8 * u * 64 + r8;
    w.dw = half8(ch + 1024 + (u * 16 + 8 * h) * 2);
  } else if constexpr (T == detail::kQ4_0 || T == detail::kQ4_1 || T == detail::kQ5_0) {
    for (int i = 0; i < 4; ++i) {
      const __m256i P = load32(ch + (4 * u + i) * 64 + r8);
      w.codes[i] = lo_nibbles(P);
      w.codes[4 + i] = hi_nibbles(P);
      w.groups[i] = 4 * u + i;
      w.groups[4 + i] = 8 + 4 * u + i;
    }
    if constexpr (T == detail::kQ5_0) {
      const __m256i H0 = load32(ch + 512 + r8), H1 = load32(ch + 576 + r8);
      for (int i = 0; i < 4; ++i) {
        w.codes[i] = _mm256_or_si256(w.codes[i], bit_to_16(H0, 4 * u + i));
        w.codes[4 + i] = _mm256_or_si256(w.codes[4 + i], bit_to_16(H1, 4 * u + i));
      }
    }
    const int64_t sc = T == detail::kQ5_0 ? 640 : 512;
    w.dw = half8(ch + sc + (u * 16 + 8 * h) * 2);
    if constexpr (T == detail::kQ4_1) w.mw = half8(ch + sc + 64 + (u * 16 + 8 * h) * 2);
  } else if constexpr (T == detail::kQ4_K) {
    const uint8_t* nib = ch + 320 + j * 512;
    for (int i = 0; i < 8; ++i) {
      const __m256i P = load32(nib + i * 64 + r8);
      w.codes[i] = u == 0 ? lo_nibbles(P) : hi_nibbles(P);
      w.groups[i] = 8 * u + i;
    }
    const int k = 2 * j + u;
    w.dw = _mm256_mul_ps(half8(ch + 16 * h), u8x8(ch + 64 + k * 16 + 8 * h));
    w.mw = negate(_mm256_mul_ps(half8(ch + 32 + 16 * h), u8x8(ch + 192 + k * 16 + 8 * h)));
  } else {
    static_assert(T == detail::kQ6_K);
    const uint8_t* pj = ch + 288 + j * 768;
    const __m256i HB = load32(pj + 512 + u * 64 + r8);
    for (int i = 0; i < 4; ++i) {
      const __m256i P = load32(pj + (4 * (u % 2) + i) * 64 + r8);
      w.codes[i] = _mm256_or_si256(u < 2 ? lo_nibbles(P) : hi_nibbles(P), bits_to_48(HB, i));
      w.groups[i] = 4 * u + i;
    }
    w.dw = _mm256_mul_ps(half8(ch + 16 * h), s8x8(ch + 32 + (4 * j + u) * 16 + 8 * h));
  }
}

// Bytes of weights prefetched ahead of the chunk computed: the hardware
// prefetchers alone leave a one-row decode step waiting on memory. Into L2
// (T2), not L1: the tile being computed, its activation rows and scratch stay
// in L1 (on Zen 4, one thread, the 262144x640 Q8_0 head streamed at 12-13 GB/s
// with T0 against 22-28 GB/s with T2).
constexpr int64_t kAheadBytes = 6144;

// Unit u's products with activation row a folded into the row's accumulators
// (acc: the scaled integer sums; accm: Q4_1 / Q4_K's minimum terms).
template <QType T>
inline void fold(const Unit& w, const XPair& a, int u, __m256& acc, __m256& accm) {
  constexpr auto ti = kQTypeInfo[T];
  constexpr int kBits = T == detail::kQ8_0 ? 8 : T == detail::kQ5_0 ? 5 : T == detail::kQ6_K ? 6 : 4;
  __m256i I = unit_sum<kBits, kGroups<T>>(w, a);
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

// The tile for N activation rows (N > kMaxBlock), each row's accumulators
// in `scratch` between units: the unit's codes are unpacked once for all N
// rows, and the rows' independent chains overlap.
template <QType T>
void tile_rows(const detail::QTile& t, const XPair* const* x, int64_t N, int64_t n_blocks32, float* y, int64_t ldy,
               float* scratch) {
  constexpr bool kMin = kQTypeInfo[T].float_min;
  for (int h = 0; h < (t.rows > 8 ? 2 : 1); ++h) {
    for (int64_t i = 0; i < 16 * N; i += 8) _mm256_store_ps(scratch + i, _mm256_setzero_ps());
    for_each_unit<T>(t, n_blocks32, h, [&](const Unit& w, int64_t p, int u) {
      for (int64_t n = 0; n < N; ++n) {
        float* acc = scratch + 16 * n;
        __m256 a0 = _mm256_load_ps(acc), am = _mm256_load_ps(acc + 8);
        fold<T>(w, x[n][p], u, a0, am);
        _mm256_store_ps(acc, a0);
        if constexpr (kMin) _mm256_store_ps(acc + 8, am);
      }
    });
    for (int64_t n = 0; n < N; ++n) {
      const __m256 a0 = _mm256_load_ps(scratch + 16 * n);
      store_half(t, h, kMin ? _mm256_add_ps(a0, _mm256_load_ps(scratch + 16 * n + 8)) : a0, y + n * ldy + 8 * h);
    }
  }
}

// Rows 8h..8h+7 of the tile for kR <= kMaxBlock activation rows, their
// accumulators in registers for the whole half, where a round trip through
// memory per unit would be the critical path (N = 1) or costs more than
// unpacking the codes for the block alone (N = 2..4; on Zen 4 at this level,
// one thread, SmolLM2's 1536x576 Q4_1 ffn_up: 0.034 -> 0.026 ms for two rows,
// 0.051 -> 0.044 for four; Gemma 3's 640x2048 Q6_K ffn_down 0.074 -> 0.066 and
// 0.110 -> 0.099; register blocks of five and more rows gained nothing or
// lost there).
constexpr int kMaxBlock = 4;

template <QType T, int kR>
void rows_block(const detail::QTile& t, const XPair* const* x, int64_t n_blocks32, float* y, int64_t ldy, int h) {
  constexpr bool kMin = kQTypeInfo[T].float_min;
  __m256 acc[kR], accm[kR];
  for (int r = 0; r < kR; ++r) acc[r] = accm[r] = _mm256_setzero_ps();
  for_each_unit<T>(t, n_blocks32, h, [&](const Unit& w, int64_t p, int u) {
    for (int r = 0; r < kR; ++r) fold<T>(w, x[r][p], u, acc[r], accm[r]);
  });
  for (int r = 0; r < kR; ++r) store_half(t, h, kMin ? _mm256_add_ps(acc[r], accm[r]) : acc[r], y + r * ldy + 8 * h);
}

// Every lane sees the same operations in the same order on either path.
template <QType T>
void tile(const detail::QTile& t, const XPair* const* x, int64_t N, int64_t n_blocks32, float* y, int64_t ldy,
          float* scratch) {
  if (N > kMaxBlock) return tile_rows<T>(t, x, N, n_blocks32, y, ldy, scratch);
  for (int h = 0; h < (t.rows > 8 ? 2 : 1); ++h) {
    switch (N) {
      case 1: rows_block<T, 1>(t, x, n_blocks32, y, ldy, h); break;
      case 2: rows_block<T, 2>(t, x, n_blocks32, y, ldy, h); break;
      case 3: rows_block<T, 3>(t, x, n_blocks32, y, ldy, h); break;
      case 4: rows_block<T, 4>(t, x, n_blocks32, y, ldy, h); break;
      default: break;
    }
  }
}

}  // namespace

DSPARK_DEFINE_QTILES(tile)
