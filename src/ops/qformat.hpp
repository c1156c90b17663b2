// qformat.hpp — the weight types of the quantized kernels and the byte orders
// of their 64-value pairs (internal to src/ops; the arithmetic is documented
// in include/dspark/ops/qmatmul.hpp).
//
// Pairs. Weights and activations go 64 elements at a time ("a pair" of
// 32-element blocks). A pair of codes is 64 bytes in one of these orders:
//   natural32: byte i is element 64p + i; fold units are the two 32-element
//              blocks (Q8_0), or the two 32-element sub-blocks (Q4_K);
//   nibble32:  bytes  0-15 = elements  0-15 of block 2p,  16-31 = 0-15 of 2p+1,
//              bytes 32-47 = elements 16-31 of block 2p,  48-63 = 16-31 of 2p+1
//              (Q4_0, Q4_1, Q5_0: a block's low nibbles hold elements 0-15 and
//              its high nibbles 16-31, so two blocks' code bytes unpack into
//              this order with one mask and one shift); units: the two blocks;
//   natural16: natural order, four 16-element units (Q6_K's sub-blocks).
// Every aligned 4-byte group g (0..15) of a pair belongs to one fold unit.
// Activations are quantized per 32 values for the 32-block types (Q8_0 /
// Q8_1 rules) and per 256 for the K-quants (Q8_K rule): natural32K and
// natural16K are the natural orders with Q8_K codes.
#pragma once

#include <cstdint>

#include "dspark/io/gguf.hpp"
#include "kernel_table.hpp"

namespace dspark::ops::detail {

enum Layout : int { kNatural32 = 0, kNibble32 = 1, kNatural32K = 2, kNatural16K = 3 };
constexpr int kLayouts = 4;
constexpr bool per256(Layout l) { return l == kNatural32K || l == kNatural16K; }

struct QTypeInfo {
  io::GGMLType ggml;
  int64_t block_elems, block_bytes;
  Layout layout;
  int shift;       // integer offset -(1 << shift) per code; 0 = none
  bool float_min;  // adds mw·dx·s (Q4_1, Q4_K)
};

inline constexpr QTypeInfo kQTypeInfo[kQTypes] = {
    {io::GGMLType::Q8_0, 32, 34, kNatural32, 7, false},   {io::GGMLType::Q4_0, 32, 18, kNibble32, 3, false},
    {io::GGMLType::Q4_1, 32, 20, kNibble32, 0, true},     {io::GGMLType::Q5_0, 32, 22, kNibble32, 4, false},
    {io::GGMLType::Q4_K, 256, 144, kNatural32K, 0, true}, {io::GGMLType::Q6_K, 256, 210, kNatural16K, 5, false},
};

/// The kernels' index of a ggml type, or kQTypes when they do not support it.
constexpr QType qtype_of(io::GGMLType t) {
  for (int i = 0; i < kQTypes; ++i)
    if (kQTypeInfo[i].ggml == t) return static_cast<QType>(i);
  return kQTypes;
}

constexpr int units_of(Layout l) { return l == kNatural16K ? 4 : 2; }

/// Element e (0..63) of a pair -> its byte position in the layout.
constexpr int byte_of(Layout l, int e) {
  if (l != kNibble32) return e;
  const int blk = e / 32, j = e % 32;
  return (j < 16 ? 0 : 32) + 16 * blk + (j % 16);
}

/// Code group (4 bytes, 0..15) -> fold unit.
constexpr int unit_of_group(Layout l, int g) {
  return l == kNibble32 ? (g / 4) % 2 : l == kNatural16K ? g / 4 : g / 8;
}

}  // namespace dspark::ops::detail
