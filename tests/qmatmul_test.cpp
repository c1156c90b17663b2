// Tests for the quantized matrix products (ops/qmatmul): hand-built blocks of
// every weight type, an fp64 reference of dequant(W) · dequant(quant(x)),
// every kernel table this CPU runs against the portable one (bitwise), and
// batch invariance: a row's result has the same bits alone, at every position
// of batches of 1..32, in ragged batches and with 1 or 2 threads.
#include "dspark/ops/qmatmul.hpp"

#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/io/dequant.hpp"
#include "ops/kernel_table.hpp"
#include "ops/qlinear_table.hpp"
#include "test_util.hpp"

namespace {

using dspark::io::GGMLType;
namespace ops = dspark::ops;

using dspark::test::ThreadCount;

void put_half(uint8_t* p, float v) {
  const c10::Half h(v);
  std::memcpy(p, &h.x, 2);
}

struct Geometry {
  int64_t elems, bytes;
};
Geometry geometry(GGMLType t) {
  switch (t) {
    case GGMLType::Q8_0: return {32, 34};
    case GGMLType::Q4_0: return {32, 18};
    case GGMLType::Q4_1: return {32, 20};
    case GGMLType::Q5_0: return {32, 22};
    case GGMLType::Q4_K: return {256, 144};
    case GGMLType::Q6_K: return {256, 210};
    default: throw std::runtime_error("type");
  }
}

// Random but well-formed blocks: random code bytes, scales of a realistic size.
std::vector<uint8_t> random_blocks(GGMLType t, int64_t n_blocks, std::mt19937& rng) {
  const Geometry g = geometry(t);
  std::vector<uint8_t> b(static_cast<size_t>(n_blocks * g.bytes));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> sc(0.002f, 0.05f);
  for (auto& v : b) v = static_cast<uint8_t>(byte(rng));
  for (int64_t i = 0; i < n_blocks; ++i) {
    uint8_t* blk = b.data() + i * g.bytes;
    switch (t) {
      case GGMLType::Q8_0: case GGMLType::Q4_0: case GGMLType::Q5_0: put_half(blk, sc(rng)); break;
      case GGMLType::Q4_1: put_half(blk, sc(rng)); put_half(blk + 2, -8 * sc(rng)); break;
      case GGMLType::Q4_K: put_half(blk, sc(rng) / 16); put_half(blk + 2, sc(rng) / 8); break;
      case GGMLType::Q6_K: {
        put_half(blk + 208, sc(rng) / 16);
        for (int s = 0; s < 16; ++s) blk[192 + s] = static_cast<uint8_t>(static_cast<int8_t>(byte(rng) % 128 - 64));
        break;
      }
      default: break;
    }
  }
  return b;
}

struct TestMatrix {
  std::vector<uint8_t> bytes;
  ops::QMatrix m;
};

TestMatrix random_matrix(GGMLType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  TestMatrix tm;
  tm.bytes = random_blocks(t, rows * cols / geometry(t).elems, rng);
  tm.m.type = t;
  tm.m.rows = rows;
  tm.m.cols = cols;
  tm.m.data = tm.bytes.data();
  return tm;
}

std::vector<float> randn(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

bool k_quant(GGMLType t) { return t == GGMLType::Q4_K || t == GGMLType::Q6_K; }

// The activation quantization written out independently, as ggml's
// quantize_row_q8_0 (32-blocks: codes round(x·127/max|x|), scale max|x|/127
// stored as binary16) and quantize_row_q8_K (256-blocks: the largest-magnitude
// value maps to -127, scale -max/127 in fp32).
std::vector<double> dequant_acts(const float* x, int64_t K, GGMLType wt) {
  std::vector<double> out(static_cast<size_t>(K));
  const int B = k_quant(wt) ? 256 : 32;
  for (int64_t b = 0; b < K / B; ++b) {
    const float* v = x + b * B;
    float amax = 0, max = 0;
    for (int j = 0; j < B; ++j)
      if (std::fabs(v[j]) > amax) amax = std::fabs(v[j]), max = v[j];
    for (int j = 0; j < B; ++j) {
      double q;
      if (B == 32) {
        const float id = amax != 0 ? 127.f / amax : 0.f;
        q = std::nearbyint(v[j] * id) * static_cast<double>(static_cast<float>(c10::Half(amax / 127.f)));
      } else {
        const float iscale = amax != 0 ? -127.f / max : 0.f;
        q = amax != 0 ? std::min(127.0, static_cast<double>(std::nearbyint(iscale * v[j]))) * (1.f / iscale) : 0.0;
      }
      out[static_cast<size_t>(b * B + j)] = q;
    }
  }
  return out;
}

// fp64 reference y[o] = Σ dequant(W)[o,k] · dequant(quant(x))[k], and the
// scale of its terms for the tolerance: max_k |W[o,k]| · Σ_k |x_k| (the kernel
// sums scale·code and min terms that can each be larger than W[o,k] itself).
void reference(const ops::QMatrix& W, const float* x, std::vector<double>& y, std::vector<double>& mag) {
  const auto xd = dequant_acts(x, W.cols, W.type);
  std::vector<float> wr(static_cast<size_t>(W.cols));
  y.assign(static_cast<size_t>(W.rows), 0.0);
  mag.assign(static_cast<size_t>(W.rows), 0.0);
  for (int64_t o = 0; o < W.rows; ++o) {
    W.dequantize_row(o, wr.data());
    double wmax = 0, xsum = 0;
    for (int64_t k = 0; k < W.cols; ++k) {
      y[o] += static_cast<double>(wr[k]) * xd[k];
      wmax = std::max(wmax, std::fabs(static_cast<double>(wr[k])));
      xsum += std::fabs(xd[k]);
    }
    // Q4_1's min term reads dx·Σx_q as binary16 (ggml's Q8_1 "s"): up to 2^-11 of it.
    mag[o] = wmax * xsum * (W.type == GGMLType::Q4_1 ? 300.0 : 1.0);
  }
}

const GGMLType kTypes[] = {GGMLType::Q8_0, GGMLType::Q4_0, GGMLType::Q4_1,
                           GGMLType::Q5_0, GGMLType::Q4_K, GGMLType::Q6_K};

int64_t cols_for(GGMLType t) { return geometry(t).elems == 256 ? 512 : 576; }

class QTypes : public ::testing::TestWithParam<GGMLType> {};

std::string type_name(const ::testing::TestParamInfo<GGMLType>& i) {
  return dspark::io::ggml_type_name(static_cast<uint32_t>(i.param));
}

TEST_P(QTypes, MatchesFp64Reference) {
  std::mt19937 rng(11);
  const GGMLType t = GetParam();
  const int64_t O = 37, K = cols_for(t), N = 5;
  auto W = random_matrix(t, O, K, rng);
  ops::QLinear layer{{W.m}};
  const auto x = randn(static_cast<size_t>(N * K), rng);
  std::vector<float> y(static_cast<size_t>(N * O));
  for (auto level : ops::supported_kernel_levels()) {
    SCOPED_TRACE(ops::to_string(level));
    ops::qlinear(x.data(), N, layer, y.data(), O, level);
    for (int64_t n = 0; n < N; ++n) {
      std::vector<double> ref, mag;
      reference(W.m, x.data() + n * K, ref, mag);
      for (int64_t o = 0; o < O; ++o) {
        // fp32 accumulation over K/64 pairs of exact integer sums: a few ulps of Σ|w·x|.
        EXPECT_NEAR(y[n * O + o], ref[o], 2e-6 * mag[o] + 1e-30) << "row " << o << " act " << n;
      }
    }
  }
}

// Every kernel table this CPU runs or checks (a level's variants too, e.g. AVX2
// with and without AVX-VNNI) gives the portable kernel's bits: full and partial
// tiles (50 rows = 3 x 16 + 2), 1 to 40 activation rows (blocks of rows in
// registers: AVX-512's 6 + 6 + 5 for 17 and 6 x 6 + 4 for 40, AVX2's 4 + 3 for
// 7 and 4 x 4 + 1 for 17, one block of 1-5), three row lengths.
TEST_P(QTypes, EveryKernelTableEqualsPortableBitwise) {
  std::mt19937 rng(12);
  const GGMLType t = GetParam();
  const int64_t O = 50;
  // Row lengths: even and odd counts of 32-blocks (an odd last block is half
  // a packed pair), and 3 super-blocks for the K-quants.
  const int64_t odd = geometry(t).elems == 256 ? 3 * 256 : 17 * 32;
  for (int64_t K : {cols_for(t), 4 * cols_for(t), odd}) {
    auto W = random_matrix(t, O, K, rng);
    ops::QLinear layer{{W.m}};
    for (int64_t N : {1, 2, 3, 4, 5, 7, 8, 17, 40}) {  // every register block and remainder
      const auto x = randn(static_cast<size_t>(N * K), rng);
      const ops::QActivations xq(x.data(), N, K, layer, ops::KernelLevel::Portable);
      std::vector<float> want(static_cast<size_t>(N * O));
      ops::detail::qlinear_table(xq, layer, want.data(), O, ops::detail::kPortableKernels);
      for (const auto* kt : ops::detail::checked_tables()) {
        const ops::QActivations xl(x.data(), N, K, layer, kt->level);
        std::vector<float> got(want.size());
        ops::detail::qlinear_table(xl, layer, got.data(), O, *kt);
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4))
            << ops::to_string(kt->level) << " K=" << K << " N=" << N;
      }
    }
  }
}

TEST_P(QTypes, RowBitsIndependentOfBatchPositionAndThreads) {
  std::mt19937 rng(13);
  const GGMLType t = GetParam();
  const int64_t O = 48, K = cols_for(t);
  auto W = random_matrix(t, O, K, rng);
  ops::QLinear layer{{W.m}};
  const auto probe = randn(static_cast<size_t>(K), rng);
  std::vector<float> alone(static_cast<size_t>(O));
  ops::qlinear(probe.data(), 1, layer, alone.data(), O);
  for (int threads : {1, 2}) {
    ThreadCount tc(threads);
    for (int64_t N = 1; N <= 32; ++N) {
      for (int64_t at_row = 0; at_row < N; ++at_row) {
        auto x = randn(static_cast<size_t>(N * K), rng);
        std::copy(probe.begin(), probe.end(), x.begin() + at_row * K);
        std::vector<float> y(static_cast<size_t>(N * O));
        ops::qlinear(x.data(), N, layer, y.data(), O);
        ASSERT_EQ(0, std::memcmp(y.data() + at_row * O, alone.data(), O * 4))
            << "N=" << N << " position " << at_row << " threads " << threads;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, QTypes, ::testing::ValuesIn(kTypes), type_name);

TEST(QMatmul, MixedPartsAndOddBlockCount) {
  // Three parts of different types (nibble and natural layouts together), a
  // row of 96 values (an odd number of 32-blocks), output stride > O.
  std::mt19937 rng(14);
  const int64_t K = 96;
  auto A = random_matrix(GGMLType::Q4_1, 7, K, rng);
  auto B = random_matrix(GGMLType::Q8_0, 5, K, rng);
  auto C = random_matrix(GGMLType::Q5_0, 18, K, rng);
  ops::QLinear layer{{A.m, B.m, C.m}};
  ASSERT_EQ(layer.rows(), 30);
  const int64_t N = 6, ldy = 33;
  const auto x = randn(static_cast<size_t>(N * K), rng);
  std::vector<float> y(static_cast<size_t>(N * ldy), -1.f), yp(y.size(), -1.f);
  ops::qlinear(x.data(), N, layer, yp.data(), ldy, ops::KernelLevel::Portable);
  for (auto level : ops::supported_kernel_levels()) {
    std::fill(y.begin(), y.end(), -1.f);
    ops::qlinear(x.data(), N, layer, y.data(), ldy, level);
    EXPECT_EQ(0, std::memcmp(y.data(), yp.data(), y.size() * 4)) << ops::to_string(level);
  }
  for (int64_t n = 0; n < N; ++n) {
    int64_t o0 = 0;
    for (const auto* m : {&A.m, &B.m, &C.m}) {
      std::vector<double> ref, mag;
      reference(*m, x.data() + n * K, ref, mag);
      for (int64_t o = 0; o < m->rows; ++o) EXPECT_NEAR(y[n * ldy + o0 + o], ref[o], 2e-6 * mag[o]);
      o0 += m->rows;
    }
    for (int64_t o = 30; o < ldy; ++o) EXPECT_EQ(y[n * ldy + o], -1.f) << "wrote past the output rows";
  }
}

// ---- hand-built blocks -----------------------------------------------------------------

// x = 127, 2, 3, ..., 32 in every block of 32 (the second block negated and
// halved): max|x| = 127 dx, so dx = 1 (0.5) and every code is exact: the
// quantized activation equals x.
std::vector<float> ramp(int64_t K) {
  std::vector<float> x(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) x[k] = static_cast<float>(k % 32 == 0 ? 127 : k % 32 + 1) * (k < 32 ? 1.f : -0.5f);
  return x;
}

double dot_ref(const std::vector<float>& w, const std::vector<float>& x, GGMLType t = GGMLType::Q8_0) {
  const auto xd = dequant_acts(x.data(), static_cast<int64_t>(x.size()), t);
  double s = 0;
  for (size_t i = 0; i < w.size(); ++i) s += w[i] * xd[i];
  return s;
}

float run_one(GGMLType t, const std::vector<uint8_t>& bytes, int64_t K, const std::vector<float>& x) {
  ops::QMatrix m;
  m.type = t;
  m.rows = 1;
  m.cols = K;
  m.data = bytes.data();
  float yp = 0;
  ops::qlinear(x.data(), 1, ops::QLinear{{m}}, &yp, 1, ops::KernelLevel::Portable);
  for (auto level : ops::supported_kernel_levels()) {
    float y = 0;
    ops::qlinear(x.data(), 1, ops::QLinear{{m}}, &y, 1, level);
    EXPECT_EQ(y, yp) << ops::to_string(level);
  }
  return yp;
}

TEST(QMatmulBlocks, Q4_0AndQ4_1NibbleOrder) {
  // Block 0: d = 0.5, codes q_j = j % 16 in elements 0-15 (low nibbles) and
  // 15 - j % 16 in 16-31 (high nibbles). Q4_0 value (q - 8) d, Q4_1 q d + m.
  for (GGMLType t : {GGMLType::Q4_0, GGMLType::Q4_1}) {
    const int64_t bb = t == GGMLType::Q4_0 ? 18 : 20, off = t == GGMLType::Q4_0 ? 2 : 4;
    std::vector<uint8_t> b(static_cast<size_t>(2 * bb), 0);
    std::vector<float> w(64);
    for (int blk = 0; blk < 2; ++blk) {
      uint8_t* p = b.data() + blk * bb;
      const float d = blk == 0 ? 0.5f : 0.25f, m = blk == 0 ? -1.f : 2.f;
      put_half(p, d);
      if (t == GGMLType::Q4_1) put_half(p + 2, m);
      for (int j = 0; j < 16; ++j) {
        const int lo = j, hi = 15 - j;
        p[off + j] = static_cast<uint8_t>(lo | (hi << 4));
        w[32 * blk + j] = t == GGMLType::Q4_0 ? (lo - 8) * d : lo * d + m;
        w[32 * blk + 16 + j] = t == GGMLType::Q4_0 ? (hi - 8) * d : hi * d + m;
      }
    }
    std::vector<float> deq(64);
    dspark::io::dequantize_to_f32(static_cast<uint32_t>(t), b.data(), deq.data(), 64);
    EXPECT_EQ(deq, w);
    const auto x = ramp(64);
    EXPECT_NEAR(run_one(t, b, 64, x), dot_ref(w, x), 1e-4);
  }
}

TEST(QMatmulBlocks, Q5_0HighBits) {
  // d = 0.125; low nibbles all 3; qh bit j set for even j: q_j = 3 + 16 [j even].
  std::vector<uint8_t> b(22, 0);
  put_half(b.data(), 0.125f);
  const uint32_t qh = 0x55555555u;
  std::memcpy(b.data() + 2, &qh, 4);
  for (int j = 0; j < 16; ++j) b[6 + j] = 0x33;
  std::vector<float> w(32);
  for (int j = 0; j < 32; ++j) w[j] = static_cast<float>((3 + (j % 2 == 0 ? 16 : 0)) - 16) * 0.125f;
  std::vector<float> deq(32);
  dspark::io::dequantize_to_f32(static_cast<uint32_t>(GGMLType::Q5_0), b.data(), deq.data(), 32);
  EXPECT_EQ(deq, w);
  const auto x = ramp(32);
  // Σ w x by hand: even j -> 0.375 * x_j, odd j -> -1.625 * x_j, x = 127, 2, 3, ..., 32.
  double hand = 0.375 * 127;
  for (int j = 1; j < 32; ++j) hand += (j % 2 == 0 ? 0.375 : -1.625) * (j + 1);
  EXPECT_DOUBLE_EQ(dot_ref(w, x), hand);
  EXPECT_EQ(run_one(GGMLType::Q5_0, b, 32, x), static_cast<float>(hand));
}

TEST(QMatmulBlocks, Q8_0SignedCodes) {
  std::vector<uint8_t> b(34, 0);
  put_half(b.data(), 2.0f);
  std::vector<float> w(32);
  for (int j = 0; j < 32; ++j) {
    const int8_t c = static_cast<int8_t>(j % 2 ? -128 + j : 127 - j);
    b[2 + j] = static_cast<uint8_t>(c);
    w[j] = 2.0f * c;
  }
  const auto x = ramp(32);
  EXPECT_NEAR(run_one(GGMLType::Q8_0, b, 32, x), dot_ref(w, x), 1e-2);
}

TEST(QMatmulBlocks, Q4_KAndQ6_KScales) {
  std::mt19937 rng(15);
  for (GGMLType t : {GGMLType::Q4_K, GGMLType::Q6_K}) {
    const auto b = random_blocks(t, 2, rng);
    std::vector<float> w(512);
    dspark::io::dequantize_to_f32(static_cast<uint32_t>(t), b.data(), w.data(), 512);
    auto x = randn(512, rng);
    const double ref = dot_ref(w, x, t);
    double mag = 0;
    const auto xd = dequant_acts(x.data(), 512, t);
    for (int i = 0; i < 512; ++i) mag += std::fabs(w[i] * xd[i]);
    EXPECT_NEAR(run_one(t, b, 512, x), ref, 2e-6 * mag) << dspark::io::ggml_type_name(static_cast<uint32_t>(t));
  }
}

TEST(QMatmul, RejectsBadShapes) {
  std::mt19937 rng(16);
  auto W = random_matrix(GGMLType::Q8_0, 4, 64, rng);
  const auto x = randn(96, rng);
  std::vector<float> y(16);
  const ops::QActivations xq(x.data(), 1, 96, ops::QLinear{{W.m}});
  EXPECT_THROW(ops::qlinear(xq, ops::QLinear{{W.m}}, y.data(), 4), dspark::InvalidArgument);
  const ops::QActivations x64(x.data(), 1, 64, ops::QLinear{{W.m}});
  EXPECT_THROW(ops::qlinear(x64, ops::QLinear{{W.m}}, y.data(), 3), dspark::InvalidArgument);
  EXPECT_THROW(ops::QActivations(x.data(), 1, 40, ops::QLinear{{W.m}}), dspark::InvalidArgument);
}

TEST(QMatmul, GatherRowsKeepsRowResults) {
  std::mt19937 rng(17);
  auto W = random_matrix(GGMLType::Q8_0, 40, 64, rng);
  const std::vector<int64_t> ids = {39, 0, 17, 17, 5};
  const ops::QMatrix g = W.m.gather_rows(ids);
  const auto x = randn(64, rng);
  std::vector<float> full(40), part(ids.size());
  ops::qlinear(x.data(), 1, ops::QLinear{{W.m}}, full.data(), 40);
  ops::qlinear(x.data(), 1, ops::QLinear{{g}}, part.data(), static_cast<int64_t>(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(part[i], full[ids[i]]);
  EXPECT_THROW(W.m.gather_rows({40}), dspark::InvalidArgument);
}

}  // namespace
