// Tests for ggml block dequantization. Every block is built byte by byte here
// and the expected values are literal numbers or come from per-element index
// formulas that read the format description directly, so a swapped nibble
// order or a mis-unpacked scale fails.
#include "dspark/io/dequant.hpp"

#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/io/gguf.hpp"
#include "test_util.hpp"

namespace {

using dspark::FormatError;
using dspark::io::dequant_supported;
using dspark::io::dequantize_tensor;
using dspark::io::dequantize_to_f32;
using dspark::io::GGMLType;
using dspark::io::GGUFTensorInfo;
using Bytes = std::vector<uint8_t>;

// A few exact binary16 encodings.
constexpr uint16_t kH_0_125 = 0x3000;
constexpr uint16_t kH_0_25 = 0x3400;
constexpr uint16_t kH_0_5 = 0x3800;
constexpr uint16_t kH_1 = 0x3C00;
constexpr uint16_t kH_2 = 0x4000;
constexpr uint16_t kH_m1_5 = 0xBE00;
constexpr uint16_t kH_m2 = 0xC000;
constexpr uint16_t kH_3 = 0x4200;

uint32_t id(GGMLType t) { return static_cast<uint32_t>(t); }

void put16(Bytes& b, uint16_t v) {
  b.push_back(static_cast<uint8_t>(v & 0xFF));
  b.push_back(static_cast<uint8_t>(v >> 8));
}

std::vector<float> decode(GGMLType t, const Bytes& b, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n), std::nanf(""));
  dequantize_to_f32(id(t), b.data(), out.data(), n);
  return out;
}

void expect_same(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "element " << i;
}

// ---- plain types -----------------------------------------------------------

TEST(DequantPlain, F32CopiesBits) {
  const std::vector<float> v = {1.5f, -2.25f, 0.0f, 3.0e38f, -1.0e-40f, 7.0f};
  Bytes b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  expect_same(decode(GGMLType::F32, b, 6), v);
}

TEST(DequantPlain, F16LiteralValues) {
  const std::vector<uint16_t> bits = {0x0000, 0x8000, 0x3C00, 0xC000, 0x3555, 0x7BFF,
                                      0x0400, 0x0001, 0x03FF, 0x8200, 0x7C00, 0xFC00, 0x7E00};
  Bytes b;
  for (uint16_t h : bits) put16(b, h);
  const auto got = decode(GGMLType::F16, b, static_cast<int64_t>(bits.size()));
  EXPECT_EQ(got[0], 0.0f);
  EXPECT_FALSE(std::signbit(got[0]));
  EXPECT_EQ(got[1], 0.0f);
  EXPECT_TRUE(std::signbit(got[1]));
  EXPECT_EQ(got[2], 1.0f);
  EXPECT_EQ(got[3], -2.0f);
  EXPECT_EQ(got[4], 0.333251953125f);
  EXPECT_EQ(got[5], 65504.0f);
  EXPECT_EQ(got[6], 6.103515625e-05f);                 // smallest normal 2^-14
  EXPECT_EQ(got[7], 5.9604644775390625e-08f);         // smallest subnormal 2^-24
  EXPECT_EQ(got[8], 6.0975551605224609375e-05f);      // 1023 * 2^-24
  EXPECT_EQ(got[9], -3.0517578125e-05f);              // -512 * 2^-24
  EXPECT_EQ(got[10], std::numeric_limits<float>::infinity());
  EXPECT_EQ(got[11], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(got[12]));
}

TEST(DequantPlain, F16AllBitPatternsMatchC10Half) {
  Bytes b;
  for (uint32_t h = 0; h < 65536; ++h) put16(b, static_cast<uint16_t>(h));
  const auto got = decode(GGMLType::F16, b, 65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    c10::Half ref;
    ref.x = static_cast<uint16_t>(h);
    const float want = static_cast<float>(ref);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got[h])) << std::hex << h;
    } else {
      EXPECT_EQ(got[h], want) << std::hex << h;
      EXPECT_EQ(std::signbit(got[h]), std::signbit(want)) << std::hex << h;
    }
  }
}

TEST(DequantPlain, BF16LiteralValues) {
  const std::vector<uint16_t> bits = {0x3F80, 0xC040, 0x4049, 0x0001, 0x8000, 0x7F80, 0xFF80, 0x7FC0};
  Bytes b;
  for (uint16_t h : bits) put16(b, h);
  const auto got = decode(GGMLType::BF16, b, static_cast<int64_t>(bits.size()));
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], -3.0f);
  EXPECT_EQ(got[2], 3.140625f);
  EXPECT_EQ(got[3], std::ldexp(1.0f, -133));
  EXPECT_EQ(got[4], 0.0f);
  EXPECT_TRUE(std::signbit(got[4]));
  EXPECT_EQ(got[5], std::numeric_limits<float>::infinity());
  EXPECT_EQ(got[6], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(got[7]));
}

// ---- Q4_0 / Q4_1 / Q8_0 ----------------------------------------------------

TEST(DequantQ4_0, SingleBlockLiteral) {
  // qs[j] = j in the low nibble, 15 - j in the high nibble.
  Bytes b;
  put16(b, kH_0_5);
  for (int j = 0; j < 16; ++j) b.push_back(static_cast<uint8_t>(j | ((15 - j) << 4)));
  ASSERT_EQ(b.size(), 18u);
  // Low nibbles are elements 0..15, high nibbles 16..31; value (q - 8) * 0.5.
  const std::vector<float> want = {
      -4.0f, -3.5f, -3.0f, -2.5f, -2.0f, -1.5f, -1.0f, -0.5f,
      0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  2.5f,  3.0f,  3.5f,
      3.5f,  3.0f,  2.5f,  2.0f,  1.5f,  1.0f,  0.5f,  0.0f,
      -0.5f, -1.0f, -1.5f, -2.0f, -2.5f, -3.0f, -3.5f, -4.0f};
  expect_same(decode(GGMLType::Q4_0, b, 32), want);
}

TEST(DequantQ4_0, MultiBlock) {
  const uint16_t ds[3] = {kH_0_5, kH_m2, kH_3};
  const float df[3] = {0.5f, -2.0f, 3.0f};
  Bytes b;
  for (int blk = 0; blk < 3; ++blk) {
    put16(b, ds[blk]);
    for (int j = 0; j < 16; ++j) b.push_back(static_cast<uint8_t>((j * 37 + blk * 101 + 11) & 0xFF));
  }
  std::vector<float> want;
  for (int i = 0; i < 96; ++i) {
    const int blk = i / 32, e = i % 32;
    const uint8_t byte = b[static_cast<size_t>(blk * 18 + 2 + e % 16)];
    const int q = e < 16 ? (byte & 0xF) : (byte >> 4);
    want.push_back(static_cast<float>(q - 8) * df[blk]);
  }
  expect_same(decode(GGMLType::Q4_0, b, 96), want);
}

TEST(DequantQ4_1, TwoBlocksLiteralAndFormula) {
  Bytes b;
  // Block 0: d = 0.25, m = -1.5, qs[j] = j | ((j ^ 5) << 4).
  put16(b, kH_0_25);
  put16(b, kH_m1_5);
  for (int j = 0; j < 16; ++j) b.push_back(static_cast<uint8_t>(j | ((j ^ 5) << 4)));
  // Block 1: d = 2, m = 1, qs[j] = 0xF0 | j.
  put16(b, kH_2);
  put16(b, kH_1);
  for (int j = 0; j < 16; ++j) b.push_back(static_cast<uint8_t>(0xF0 | j));
  ASSERT_EQ(b.size(), 40u);
  const auto got = decode(GGMLType::Q4_1, b, 64);
  // Hand-computed spot values.
  EXPECT_EQ(got[0], -1.5f);         // q 0
  EXPECT_EQ(got[15], 2.25f);        // q 15: 3.75 - 1.5
  EXPECT_EQ(got[16], -0.25f);       // q 0^5 = 5: 1.25 - 1.5
  EXPECT_EQ(got[31], 1.0f);         // q 15^5 = 10: 2.5 - 1.5
  EXPECT_EQ(got[32], 1.0f);         // q 0 * 2 + 1
  EXPECT_EQ(got[47], 31.0f);        // q 15
  EXPECT_EQ(got[48], 31.0f);        // high nibble 15
  EXPECT_EQ(got[63], 31.0f);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(got[static_cast<size_t>(i)], 0.25f * static_cast<float>(i) - 1.5f);
    EXPECT_EQ(got[static_cast<size_t>(16 + i)], 0.25f * static_cast<float>(i ^ 5) - 1.5f);
    EXPECT_EQ(got[static_cast<size_t>(32 + i)], 2.0f * static_cast<float>(i) + 1.0f);
  }
}

TEST(DequantQ8_0, MultiBlock) {
  Bytes b;
  put16(b, kH_0_125);
  for (int j = 0; j < 32; ++j) b.push_back(static_cast<uint8_t>(static_cast<int8_t>(j * 8 - 128)));
  put16(b, kH_m2);
  for (int j = 0; j < 32; ++j) b.push_back(static_cast<uint8_t>(static_cast<int8_t>(127 - j)));
  ASSERT_EQ(b.size(), 68u);
  const auto got = decode(GGMLType::Q8_0, b, 64);
  EXPECT_EQ(got[0], -16.0f);  // -128 * 0.125
  EXPECT_EQ(got[16], 0.0f);
  EXPECT_EQ(got[31], 15.0f);  // 120 * 0.125
  EXPECT_EQ(got[32], -254.0f);
  EXPECT_EQ(got[63], -192.0f);  // 96 * -2
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(got[static_cast<size_t>(j)], static_cast<float>(j * 8 - 128) * 0.125f);
    EXPECT_EQ(got[static_cast<size_t>(32 + j)], static_cast<float>(127 - j) * -2.0f);
  }
}

// ---- Q4_K ------------------------------------------------------------------

// Sub-block scales and mins used below; every one needs the full 6 bits, and
// sub-blocks 4..7 have non-zero upper two bits stored in bytes 0..7.
constexpr int kQ4KSc[8] = {1, 63, 17, 40, 37, 58, 19, 44};
constexpr int kQ4KMn[8] = {9, 7, 63, 21, 50, 3, 29, 60};
// The 12 packed bytes for those values, worked out by hand:
//   bytes 0..3:  sc[k] | (sc[k+4] >> 4) << 6
//   bytes 4..7:  mn[k] | (mn[k+4] >> 4) << 6
//   bytes 8..11: (sc[k+4] & 15) | (mn[k+4] & 15) << 4
constexpr uint8_t kQ4KScales[12] = {0x81, 0xFF, 0x51, 0xA8, 0xC9, 0x07,
                                    0x7F, 0xD5, 0x25, 0x3A, 0xD3, 0xCC};

Bytes q4k_block(uint16_t d, uint16_t dmin, const uint8_t scales[12], int seed) {
  Bytes b;
  put16(b, d);
  put16(b, dmin);
  b.insert(b.end(), scales, scales + 12);
  for (int i = 0; i < 128; ++i) b.push_back(static_cast<uint8_t>((i * 7 + 3 + seed) & 0xFF));
  return b;
}

// Element i of a Q4_K block: sub-block k = i / 32; the 32-byte group i / 64
// holds the even sub-block in low nibbles and the odd one in high nibbles.
float q4k_ref(const Bytes& blk, float d, float dmin, const int sc[8], const int mn[8], int i) {
  const int k = i / 32;
  const uint8_t byte = blk[static_cast<size_t>(16 + (i / 64) * 32 + i % 32)];
  const int q = (k % 2 == 0) ? (byte & 0xF) : (byte >> 4);
  return d * static_cast<float>(sc[k]) * static_cast<float>(q) - dmin * static_cast<float>(mn[k]);
}

TEST(DequantQ4_K, PackedScalesAgreeWithHandPacking) {
  // Re-derive the hand-packed bytes from the 6-bit values.
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(kQ4KScales[k], (kQ4KSc[k] | ((kQ4KSc[k + 4] >> 4) << 6)) & 0xFF) << k;
    EXPECT_EQ(kQ4KScales[k + 4], (kQ4KMn[k] | ((kQ4KMn[k + 4] >> 4) << 6)) & 0xFF) << k;
    EXPECT_EQ(kQ4KScales[k + 8], (kQ4KSc[k + 4] & 15) | ((kQ4KMn[k + 4] & 15) << 4)) << k;
  }
}

TEST(DequantQ4_K, SingleBlockLiteralSpots) {
  const Bytes b = q4k_block(kH_0_5, kH_0_25, kQ4KScales, 0);
  ASSERT_EQ(b.size(), 144u);
  const auto got = decode(GGMLType::Q4_K, b, 256);
  // element 0:   sub-block 0, qs[0] = 3, low nibble 3:   0.5*1*3   - 0.25*9  = -0.75
  EXPECT_EQ(got[0], -0.75f);
  // element 32:  sub-block 1, qs[0] = 0x03, high nibble 0: 0 - 0.25*7       = -1.75
  EXPECT_EQ(got[32], -1.75f);
  // element 100: sub-block 3, qs[36] = 0xFF, high nibble 15: 0.5*40*15 - 0.25*21 = 294.75
  EXPECT_EQ(got[100], 294.75f);
  // element 130: sub-block 4, qs[66] = 0xD1, low nibble 1: 0.5*37*1 - 0.25*50 = 6
  EXPECT_EQ(got[130], 6.0f);
  // element 170: sub-block 5, qs[74] = 0x09, high nibble 0: 0 - 0.25*3 = -0.75
  EXPECT_EQ(got[170], -0.75f);
  // element 200: sub-block 6, qs[104] = 0xDB, low nibble 11: 0.5*19*11 - 0.25*29 = 97.25
  EXPECT_EQ(got[200], 97.25f);
  // element 255: sub-block 7, qs[127] = 0x7C, high nibble 7: 0.5*44*7 - 0.25*60 = 139
  EXPECT_EQ(got[255], 139.0f);
  // element 64:  sub-block 2, qs[32] = 0xE3, low nibble 3: 0.5*17*3 - 0.25*63 = 9.75
  EXPECT_EQ(got[64], 9.75f);
  // element 224: sub-block 7, qs[96] = 0xA3, high nibble 10: 0.5*44*10 - 0.25*60 = 205
  EXPECT_EQ(got[224], 205.0f);
}

TEST(DequantQ4_K, SingleBlockAllElements) {
  const Bytes b = q4k_block(kH_0_5, kH_0_25, kQ4KScales, 0);
  const auto got = decode(GGMLType::Q4_K, b, 256);
  for (int i = 0; i < 256; ++i)
    EXPECT_EQ(got[static_cast<size_t>(i)], q4k_ref(b, 0.5f, 0.25f, kQ4KSc, kQ4KMn, i)) << i;
}

TEST(DequantQ4_K, MultiBlock) {
  // Block 1 swaps the roles: its scales are block 0's mins and vice versa.
  const uint8_t swapped[12] = {0xC9, 0x07, 0x7F, 0xD5, 0x81, 0xFF, 0x51, 0xA8, 0x52, 0xA3, 0x3D, 0xCC};
  Bytes b0 = q4k_block(kH_0_5, kH_0_25, kQ4KScales, 0);
  Bytes b1 = q4k_block(kH_m2, kH_0_125, swapped, 55);
  Bytes b = b0;
  b.insert(b.end(), b1.begin(), b1.end());
  const auto got = decode(GGMLType::Q4_K, b, 512);
  for (int i = 0; i < 256; ++i) {
    EXPECT_EQ(got[static_cast<size_t>(i)], q4k_ref(b0, 0.5f, 0.25f, kQ4KSc, kQ4KMn, i)) << i;
    EXPECT_EQ(got[static_cast<size_t>(256 + i)], q4k_ref(b1, -2.0f, 0.125f, kQ4KMn, kQ4KSc, i))
        << 256 + i;
  }
}

// ---- Q6_K ------------------------------------------------------------------

constexpr int8_t kQ6KSc[16] = {1, -1, 2, -3, 5, -8, 13, -21, 34, -55, 89, -128, 127, -7, 3, -2};

// Layout offsets inside a 210-byte block.
constexpr size_t kQl = 0, kQh = 128, kSc = 192, kD = 208;

Bytes q6k_block(uint16_t d) {
  Bytes b(210, 0);
  for (int k = 0; k < 16; ++k) b[kSc + static_cast<size_t>(k)] = static_cast<uint8_t>(kQ6KSc[k]);
  b[kD] = static_cast<uint8_t>(d & 0xFF);
  b[kD + 1] = static_cast<uint8_t>(d >> 8);
  return b;
}

// Element i of a Q6_K block, read straight from the layout description:
// half h = i / 128; within it, quarter g = (i % 128) / 32 and l = i % 32.
// Quarters 0/1 use the low nibbles of ql[l] / ql[l+32], quarters 2/3 the high
// nibbles; qh[l] contributes bits (2g, 2g+1). Scale index is i / 16.
float q6k_ref(const Bytes& blk, float d, int i) {
  const int h = i / 128, g = (i % 128) / 32, l = i % 32;
  const uint8_t qlb = blk[kQl + static_cast<size_t>(64 * h + l + 32 * (g % 2))];
  const int nib = g < 2 ? (qlb & 0xF) : (qlb >> 4);
  const int hi = (blk[kQh + static_cast<size_t>(32 * h + l)] >> (2 * g)) & 3;
  const int q = (nib | (hi << 4)) - 32;
  const auto sc = static_cast<int8_t>(blk[kSc + static_cast<size_t>(i / 16)]);
  return d * static_cast<float>(sc) * static_cast<float>(q);
}

TEST(DequantQ6_K, SingleBlockLiteralSpots) {
  Bytes b = q6k_block(kH_0_5);
  b[kQl + 0] = 0x9A;    // low 10, high 9
  b[kQl + 32] = 0x5F;   // low 15, high 5
  b[kQh + 0] = 0xE4;    // bit pairs (low to high): 0, 1, 2, 3
  b[kQl + 81] = 0x3C;   // second half, l = 17: low 12, high 3
  b[kQl + 113] = 0x07;  // second half, l = 17 + 32: low 7, high 0
  b[kQh + 49] = 0x1B;   // second half, l = 17: bit pairs 3, 2, 1, 0
  const auto got = decode(GGMLType::Q6_K, b, 256);
  EXPECT_EQ(got[0], -11.0f);    // q 10|0<<4 = 10 -> -22, scale 1:   0.5*1*-22
  EXPECT_EQ(got[32], -1.0f);    // q 15|1<<4 = 31 -> -1,  scale 2:   0.5*2*-1
  EXPECT_EQ(got[64], 22.5f);    // q 9|2<<4 = 41 -> 9,    scale 5:   0.5*5*9
  EXPECT_EQ(got[96], 136.5f);   // q 5|3<<4 = 53 -> 21,   scale 13:  0.5*13*21
  EXPECT_EQ(got[145], -770.0f); // q 12|3<<4 = 60 -> 28,  scale -55: 0.5*-55*28
  EXPECT_EQ(got[177], -448.0f); // q 7|2<<4 = 39 -> 7,    scale -128
  EXPECT_EQ(got[209], 45.5f);   // q 3|1<<4 = 19 -> -13,  scale -7
  EXPECT_EQ(got[241], 32.0f);   // q 0 -> -32,            scale -2
  // Untouched bytes give q = -32.
  EXPECT_EQ(got[1], -16.0f);    // scale 1
  EXPECT_EQ(got[16], 16.0f);    // scale -1
  EXPECT_EQ(got[176], 2048.0f); // scale -128
  EXPECT_EQ(got[192], -2032.0f);// scale 127
  EXPECT_EQ(got[255], 32.0f);   // scale -2
}

TEST(DequantQ6_K, EncodedValuesRoundTrip) {
  // Pack a chosen 6-bit value for each element, then expect (q - 32) * d * scale.
  int qv[256];
  for (int i = 0; i < 256; ++i) qv[i] = (i * 29 + 7) % 64;
  Bytes b = q6k_block(kH_0_25);
  for (int i = 0; i < 256; ++i) {
    const int h = i / 128, g = (i % 128) / 32, l = i % 32;
    uint8_t& qlb = b[kQl + static_cast<size_t>(64 * h + l + 32 * (g % 2))];
    qlb = static_cast<uint8_t>(qlb | ((qv[i] & 0xF) << (g < 2 ? 0 : 4)));
    uint8_t& qhb = b[kQh + static_cast<size_t>(32 * h + l)];
    qhb = static_cast<uint8_t>(qhb | ((qv[i] >> 4) << (2 * g)));
  }
  const auto got = decode(GGMLType::Q6_K, b, 256);
  for (int i = 0; i < 256; ++i) {
    const float want = 0.25f * static_cast<float>(kQ6KSc[i / 16]) * static_cast<float>(qv[i] - 32);
    EXPECT_EQ(got[static_cast<size_t>(i)], want) << i;
  }
}

TEST(DequantQ6_K, MultiBlockAllQhPatterns) {
  // Four blocks whose qh bytes run through all 256 values.
  const uint16_t ds[4] = {kH_0_5, kH_m2, kH_1, kH_0_125};
  const float df[4] = {0.5f, -2.0f, 1.0f, 0.125f};
  Bytes all;
  std::vector<Bytes> blocks;
  for (int blk = 0; blk < 4; ++blk) {
    Bytes b = q6k_block(ds[blk]);
    for (int k = 0; k < 128; ++k) b[kQl + static_cast<size_t>(k)] = static_cast<uint8_t>((k * 73 + blk * 19 + 5) & 0xFF);
    for (int k = 0; k < 64; ++k) b[kQh + static_cast<size_t>(k)] = static_cast<uint8_t>(64 * blk + k);
    blocks.push_back(b);
    all.insert(all.end(), b.begin(), b.end());
  }
  ASSERT_EQ(all.size(), 840u);
  const auto got = decode(GGMLType::Q6_K, all, 1024);
  for (int blk = 0; blk < 4; ++blk)
    for (int i = 0; i < 256; ++i)
      EXPECT_EQ(got[static_cast<size_t>(blk * 256 + i)], q6k_ref(blocks[static_cast<size_t>(blk)], df[blk], i))
          << "block " << blk << " element " << i;
}

// ---- errors ----------------------------------------------------------------

TEST(DequantErrors, SupportedSet) {
  for (GGMLType t : {GGMLType::F32, GGMLType::F16, GGMLType::BF16, GGMLType::Q4_0, GGMLType::Q4_1,
                     GGMLType::Q5_0, GGMLType::Q8_0, GGMLType::Q4_K, GGMLType::Q6_K})
    EXPECT_TRUE(dequant_supported(id(t))) << id(t);
  for (uint32_t t : {5u, 7u, 9u, 10u, 11u, 13u, 15u, 24u, 28u, 99u})
    EXPECT_FALSE(dequant_supported(t)) << t;
}

std::string error_of(uint32_t type_id, int64_t n) {
  Bytes b(4096, 0);
  std::vector<float> out(4096);
  try {
    dequantize_to_f32(type_id, b.data(), out.data(), n);
  } catch (const FormatError& e) {
    return e.what();
  }
  return "<no FormatError>";
}

TEST(DequantErrors, UnsupportedTypesThrow) {
  const std::string q5k = error_of(13, 256);
  EXPECT_NE(q5k.find("Q5_K"), std::string::npos) << q5k;
  const std::string unknown = error_of(99, 32);
  EXPECT_NE(unknown.find("type#99"), std::string::npos) << unknown;
}

TEST(DequantErrors, PartialBlockCountThrows) {
  const std::string q40 = error_of(id(GGMLType::Q4_0), 33);
  EXPECT_NE(q40.find("Q4_0"), std::string::npos) << q40;
  EXPECT_NE(error_of(id(GGMLType::Q4_K), 128).find("Q4_K"), std::string::npos);
  EXPECT_NE(error_of(id(GGMLType::Q6_K), 300).find("Q6_K"), std::string::npos);
  EXPECT_NE(error_of(id(GGMLType::Q8_0), -32).find("Q8_0"), std::string::npos);
  EXPECT_EQ(error_of(id(GGMLType::Q8_0), 64), "<no FormatError>");
  EXPECT_EQ(error_of(id(GGMLType::Q4_0), 0), "<no FormatError>");
}

// ---- whole tensors ---------------------------------------------------------

GGUFTensorInfo make_info(const std::string& name, std::vector<int64_t> ne, GGMLType t, const Bytes& data) {
  GGUFTensorInfo info;
  info.name = name;
  info.ne = std::move(ne);
  info.type_id = id(t);
  info.n_bytes = data.size();
  info.data = data.data();
  return info;
}

TEST(DequantTensor, Q8_0ShapeAndDtypes) {
  // ne {32, 3}: three rows of one Q8_0 block each -> shape [3, 32].
  Bytes b;
  const uint16_t ds[3] = {kH_1, kH_0_5, kH_m2};
  for (int r = 0; r < 3; ++r) {
    put16(b, ds[r]);
    for (int j = 0; j < 32; ++j) b.push_back(static_cast<uint8_t>(static_cast<int8_t>(j - 16 + r)));
  }
  const auto info = make_info("blk.0.ffn_up.weight", {32, 3}, GGMLType::Q8_0, b);
  const float df[3] = {1.0f, 0.5f, -2.0f};

  at::Tensor f = dequantize_tensor(info, at::kFloat);
  ASSERT_EQ(f.scalar_type(), at::kFloat);
  ASSERT_EQ(f.sizes().vec(), (std::vector<int64_t>{3, 32}));
  ASSERT_TRUE(f.is_contiguous());
  at::Tensor h = dequantize_tensor(info);
  ASSERT_EQ(h.scalar_type(), at::kBFloat16);
  ASSERT_EQ(h.sizes().vec(), (std::vector<int64_t>{3, 32}));
  auto fa = f.accessor<float, 2>();
  for (int r = 0; r < 3; ++r)
    for (int j = 0; j < 32; ++j) {
      const float want = static_cast<float>(j - 16 + r) * df[r];
      EXPECT_EQ(fa[r][j], want);
      EXPECT_EQ(h[r][j].item<float>(), want);  // small integers and halves are exact in bf16
    }
}

TEST(DequantTensor, LargeF16ToBF16MatchesReference) {
  // Several work chunks plus a ragged tail, to cover the parallel path.
  const int64_t rows = 37, cols = 4096 + 64;
  Bytes b;
  for (int64_t i = 0; i < rows * cols; ++i) put16(b, static_cast<uint16_t>(((i * 2654435761u) >> 7) & 0xFBFF));
  const auto info = make_info("token_embd.weight", {cols, rows}, GGMLType::F16, b);
  at::Tensor got = dequantize_tensor(info, at::kBFloat16);
  ASSERT_EQ(got.sizes().vec(), (std::vector<int64_t>{rows, cols}));
  // Reference: c10::Half -> float -> bf16 through ATen's own conversion.
  at::Tensor half = at::empty({rows, cols}, at::kHalf);
  std::memcpy(half.data_ptr(), b.data(), b.size());
  at::Tensor want = half.to(at::kFloat).to(at::kBFloat16);
  EXPECT_TRUE(at::equal(got, want));
  at::Tensor got32 = dequantize_tensor(info, at::kFloat);
  EXPECT_TRUE(at::equal(got32, half.to(at::kFloat)));
}

TEST(DequantTensor, F32ToBF16RoundsToNearestEven) {
  const std::vector<float> v = {1.0f, 1.00390625f /* tie -> 1.0 */, 1.01171875f /* tie -> 1.015625 */,
                                std::nextafter(1.00390625f, 2.0f) /* above tie */, -3.5f, 1e-30f, 65504.0f, 0.1f};
  Bytes b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  const auto info = make_info("x", {static_cast<int64_t>(v.size())}, GGMLType::F32, b);
  at::Tensor got = dequantize_tensor(info, at::kBFloat16);
  EXPECT_EQ(got[0].item<float>(), 1.0f);
  EXPECT_EQ(got[1].item<float>(), 1.0f);
  EXPECT_EQ(got[2].item<float>(), 1.015625f);
  EXPECT_EQ(got[3].item<float>(), 1.0078125f);
  at::Tensor ref = at::from_blob(const_cast<float*>(v.data()), {static_cast<int64_t>(v.size())}, at::kFloat)
                       .to(at::kBFloat16);
  EXPECT_TRUE(at::equal(got, ref));
  at::Tensor f = dequantize_tensor(info, at::kFloat);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(f[static_cast<int64_t>(i)].item<float>(), v[i]);
}

TEST(DequantTensor, BF16PassesThrough) {
  Bytes b;
  for (int i = 0; i < 3 * 4100; ++i) put16(b, static_cast<uint16_t>(0x3F80 + (i % 300) - 150));
  const auto info = make_info("output_norm.weight", {4100, 3}, GGMLType::BF16, b);
  at::Tensor got = dequantize_tensor(info, at::kBFloat16);
  ASSERT_EQ(got.sizes().vec(), (std::vector<int64_t>{3, 4100}));
  EXPECT_EQ(std::memcmp(got.data_ptr(), b.data(), b.size()), 0);
  at::Tensor f = dequantize_tensor(info, at::kFloat);
  EXPECT_TRUE(at::equal(f, got.to(at::kFloat)));
}

TEST(DequantTensor, Q4_KAndQ6_KTensors) {
  Bytes q4 = q4k_block(kH_0_5, kH_0_25, kQ4KScales, 0);
  Bytes more = q4k_block(kH_0_5, kH_0_25, kQ4KScales, 9);
  q4.insert(q4.end(), more.begin(), more.end());
  const auto i4 = make_info("blk.0.attn_q.weight", {256, 2}, GGMLType::Q4_K, q4);
  at::Tensor t4 = dequantize_tensor(i4, at::kFloat);
  Bytes second(q4.begin() + 144, q4.end());
  for (int i = 0; i < 256; ++i) {
    EXPECT_EQ(t4[0][i].item<float>(), q4k_ref(q4, 0.5f, 0.25f, kQ4KSc, kQ4KMn, i));
    EXPECT_EQ(t4[1][i].item<float>(), q4k_ref(second, 0.5f, 0.25f, kQ4KSc, kQ4KMn, i));
  }
  Bytes q6 = q6k_block(kH_1);
  for (int k = 0; k < 192; ++k) q6[static_cast<size_t>(k)] = static_cast<uint8_t>(k * 13 + 1);
  const auto i6 = make_info("output.weight", {256}, GGMLType::Q6_K, q6);
  at::Tensor t6 = dequantize_tensor(i6, at::kFloat);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(t6[i].item<float>(), q6k_ref(q6, 1.0f, i));
}

TEST(DequantTensor, ErrorsNameTensorAndType) {
  Bytes b(1024, 0);
  auto info = make_info("blk.3.ffn_down.weight", {256, 2}, GGMLType::Q5_K, b);
  try {
    dequantize_tensor(info);
    FAIL() << "expected FormatError";
  } catch (const FormatError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("blk.3.ffn_down.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Q5_K"), std::string::npos) << msg;
  }
  info.type_id = 99;
  try {
    dequantize_tensor(info);
    FAIL() << "expected FormatError";
  } catch (const FormatError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("blk.3.ffn_down.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("type#99"), std::string::npos) << msg;
  }
  // Too few bytes for the declared elements.
  auto small = make_info("blk.3.attn_k.weight", {32, 4}, GGMLType::Q8_0, b);
  small.n_bytes = 34 * 3;
  EXPECT_THROW(dequantize_tensor(small), FormatError);
  // A count that is not a whole number of blocks.
  auto ragged = make_info("blk.3.attn_v.weight", {48}, GGMLType::Q4_0, b);
  EXPECT_THROW(dequantize_tensor(ragged), FormatError);
}

}  // namespace

// The test fixtures' block writer (test::quantize_blocks) against this
// dequantizer: every type round-trips random values to within one
// quantization step of its block (a layout mix-up would move values by
// whole blocks' ranges).
TEST(DequantFixtures, QuantizeBlocksRoundTrips) {
  std::mt19937 rng(77);
  std::normal_distribution<float> nd(0.f, 0.5f);
  std::vector<float> x(1024);
  for (float& v : x) v = nd(rng);
  for (GGMLType t : {GGMLType::Q8_0, GGMLType::Q4_0, GGMLType::Q4_1, GGMLType::Q5_0, GGMLType::Q4_K, GGMLType::Q6_K}) {
    const std::string b = dspark::test::quantize_blocks(x, t);
    std::vector<float> y(x.size());
    dequantize_to_f32(id(t), reinterpret_cast<const uint8_t*>(b.data()), y.data(), static_cast<int64_t>(x.size()));
    const int bits = t == GGMLType::Q8_0 ? 8 : t == GGMLType::Q5_0 ? 5 : t == GGMLType::Q6_K ? 6 : 4;
    double range = 0;
    for (float v : x) range = std::max(range, 2.0 * std::fabs(v));
    const double step = range / ((1 << bits) - 1);
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_NEAR(y[i], x[i], step) << dspark::io::ggml_type_name(id(t)) << " element " << i;
  }
}
