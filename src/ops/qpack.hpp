// qpack.hpp — quantized weights repacked into 16-row tiles for the SIMD
// kernels (internal to src/ops).
//
// A decode step streams every weight once, so the SIMD kernels read each
// matrix as one contiguous run of tiles whose bytes are already where the
// registers want them: no transposes, no gathers, no per-row scale loads. The
// packed form holds exactly the GGUF blocks' information (the same code bits,
// binary16 scales kept as binary16, Q4_K's 6-bit scales as bytes), so a tile
// is as many bytes as its rows' blocks, give or take Q4_K's 4 bytes per 256.
//
// A tile is 16 rows (rows past the matrix are zero). Each row is cut into
// chunks — a pair of 32-blocks (64 values) for Q8_0, Q4_0, Q4_1, Q5_0, a
// 256-value super-block (4 pairs) for Q4_K and Q6_K — and the tile stores its
// chunks in order, each with all 16 rows side by side. With "dword j of row
// r" meaning 4 bytes, arrays below are [..][16 rows][4 bytes] row-major:
//   Q8_0  codes[16][16][4]  int8 codes of group g (elements 4g..4g+3 of the pair)
//         d[2][16]          binary16 scale of block 2p+b
//   Q4_0  nib[8][16][4]     dword j: low nibbles = group j, high = group j+8 of
//         d[2][16]          the nibble32 order (qformat.hpp), i.e. the raw qs bytes
//   Q4_1  nib, d, m[2][16]  (m: the block minimum)
//   Q5_0  nib, hb[2][16][4], d   hb[0] byte e bit j = fifth bit of element e
//                           of group j; hb[1] the same for group j + 8
//   Q4_K  d[16] dmin[16] (binary16), sc[8][16] mn[8][16] (bytes), then per pair
//         nib[8][16][4]     (natural order: group j low nibbles, j+8 high)
//   Q6_K  d[16] (binary16), sc[16][16] (int8), then per pair nib[8][16][4] and
//         hb[4][16][4]      hb[k] byte e bits 2m..2m+1 = bits 4-5 of element e
//                           of group 4k+m
// An odd last block of a 32-block type leaves its half of the pair zero.
#pragma once

#include <cstdint>
#include <memory>

#include "kernel_table.hpp"

namespace dspark::ops::detail {

constexpr int kTileRows = 16;

/// Values per chunk: 64 for the 32-block types, 256 for the K-quants.
constexpr int64_t chunk_values(QType t) { return t == kQ4_K || t == kQ6_K ? 256 : 64; }
/// Bytes of one chunk of one 16-row tile.
constexpr int64_t chunk_bytes(QType t) {
  switch (t) {
    case kQ8_0: return 1024 + 64;
    case kQ4_0: return 512 + 64;
    case kQ4_1: return 512 + 128;
    case kQ5_0: return 512 + 128 + 64;
    case kQ4_K: return 320 + 4 * 512;
    case kQ6_K: return 288 + 4 * (512 + 256);
    default: return 0;
  }
}

struct AlignedFree {
  void operator()(uint8_t* p) const;
};

/// A matrix's tiles: tile i at data + i * tile_bytes (64-byte aligned).
struct PackedQ {
  std::unique_ptr<uint8_t[], AlignedFree> data;
  int64_t tile_bytes = 0;
  int64_t tiles = 0;
  const uint8_t* tile(int64_t i) const { return data.get() + i * tile_bytes; }
};

/// Packs `rows` rows of `cols` values of type t (GGUF blocks, row_bytes apart).
PackedQ pack_q(QType t, const uint8_t* raw, int64_t rows, int64_t cols, int64_t row_bytes);

}  // namespace dspark::ops::detail
