// Kernel levels: every table this CPU runs (src/ops/kernel_table.hpp) gives
// the portable table's bits for every fp32 kernel, the bf16 products and the
// activation quantization, on random and awkward inputs (tails shorter than
// 16 lanes, ties, zeros, large magnitudes); the portable kernels against
// double-precision references (exp, SiLU, GELU, tanh); and the level choice
// (DSPARK_KERNELS) as a process sees it. The quantized products are checked
// the same way in qmatmul_test.cpp.
#include <bit>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/ops/kernel_level.hpp"
#include "dspark/ops/kernels.hpp"
#include "ops/kernel_table.hpp"
#include "test_util.hpp"

// The command that starts `dspark`: through the emulator in a cross build.
#ifndef DSPARK_EMULATOR
#define DSPARK_EMULATOR ""
#endif
#define DSPARK_COMMAND DSPARK_EMULATOR " " DSPARK_BINARY

namespace {

namespace ops = dspark::ops;
using ops::detail::KernelTable;
using ops::detail::kPortableKernels;

// With DSPARK_LEVEL_RUN set (the per-level test runs CMakeLists.txt adds),
// the whole binary skips when DSPARK_KERNELS names a level this CPU lacks or
// the level the default run already covers (the best one).
class ForcedLevelEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* run = std::getenv("DSPARK_LEVEL_RUN");
    const char* forced = std::getenv("DSPARK_KERNELS");
    if (!run || !forced || !*forced) return;
    const auto levels = ops::supported_kernel_levels();
    const auto want = ops::kernel_level_from_string(forced);
    if (std::find(levels.begin(), levels.end(), want) == levels.end())
      GTEST_SKIP() << "this CPU does not run the " << forced << " kernels";
    if (want == levels.back()) GTEST_SKIP() << forced << " is this CPU's default level: the main run covers it";
  }
};
const auto* const kForcedLevel = ::testing::AddGlobalTestEnvironment(new ForcedLevelEnvironment);

std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Runs f(table) -> std::vector<float> on the portable table and on every
// other table this CPU runs or checks (detail::checked_tables()), expecting
// the same bits.
template <class F>
void expect_every_level_equal(const char* what, F f) {
  const auto want = f(kPortableKernels);
  for (const KernelTable* kt : ops::detail::checked_tables()) {
    const auto got = f(*kt);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      uint32_t a, b;
      std::memcpy(&a, &got[i], 4);
      std::memcpy(&b, &want[i], 4);
      ASSERT_EQ(a, b) << what << ": level " << ops::to_string(kt->level) << " differs at " << i << " (" << got[i]
                      << " vs portable " << want[i] << ")";
    }
  }
}

TEST(KernelLevels, PortableIsAlwaysRunnableAndFirst) {
  const auto levels = ops::supported_kernel_levels();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), ops::KernelLevel::Portable);
  EXPECT_EQ(ops::detail::runnable_tables().front(), &kPortableKernels);
  // The active level is one of them and is described by name.
  const auto active = ops::active_kernel_level();
  EXPECT_NE(std::find(levels.begin(), levels.end(), active), levels.end());
  EXPECT_EQ(ops::kernel_description().rfind(ops::to_string(active), 0), 0u);
}

TEST(KernelLevels, NamesRoundTripAndUnknownNamesAreRefused) {
  for (auto l : {ops::KernelLevel::Portable, ops::KernelLevel::Avx2, ops::KernelLevel::Avx512, ops::KernelLevel::Neon})
    EXPECT_EQ(ops::kernel_level_from_string(ops::to_string(l)), l);
  try {
    ops::kernel_level_from_string("sse9");
    FAIL() << "accepted an unknown level";
  } catch (const dspark::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("portable, avx2, avx512, neon"), std::string::npos) << e.what();
  }
}

TEST(KernelLevels, ForcedLevelIsWhatTheProcessRuns) {
  // DSPARK_KERNELS is read once per process: check it in a child.
  for (auto l : ops::supported_kernel_levels()) {
    const std::string cmd = "DSPARK_KERNELS=" + ops::to_string(l) + " " DSPARK_COMMAND " --version";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    char buf[256] = {};
    const size_t n = fread(buf, 1, sizeof buf - 1, p);
    EXPECT_EQ(pclose(p), 0);
    EXPECT_NE(std::string(buf, n).find("kernels " + ops::to_string(l)), std::string::npos) << buf;
  }
  // A level this CPU lacks (or an unknown one) is refused with the levels it has.
  const std::string bad = "DSPARK_KERNELS=warp " DSPARK_COMMAND " --version 2>&1";
  FILE* p = popen(bad.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[512] = {};
  const size_t n = fread(buf, 1, sizeof buf - 1, p);
  EXPECT_NE(pclose(p), 0);
  EXPECT_NE(std::string(buf, n).find("unknown kernel level 'warp'"), std::string::npos) << buf;
}

// ---- fp32 kernels: bitwise across levels -----------------------------------------------

TEST(KernelLevels, DotAndScoresEqualPortable) {
  std::mt19937 rng(1);
  for (int64_t n : {1, 5, 15, 16, 17, 31, 64, 100, 256, 576, 640}) {
    const auto a = randn(n, rng, 3.f), b = randn(n, rng);
    expect_every_level_equal("dot", [&](const KernelTable& kt) { return std::vector<float>{kt.dot(a.data(), b.data(), n)}; });
  }
  for (int64_t hd : {16, 64, 80, 256}) {
    // Three queries reading 37, 20 and 1 keys in one pass.
    const int64_t L[3] = {37, 20, 1};
    const auto q = randn(3 * hd, rng), K = randn(L[0] * hd, rng);
    expect_every_level_equal("scores", [&](const KernelTable& kt) {
      std::vector<float> s(3 * L[0], -1.f);
      const float* qs[3] = {q.data(), q.data() + hd, q.data() + 2 * hd};
      float* ss[3] = {s.data(), s.data() + L[0], s.data() + 2 * L[0]};
      kt.scores(qs, L, 3, K.data(), hd, 0.125f, ss);
      return s;
    });
    // The contract, on every level: each score is that level's dot(q, k_j)
    // times the scale, bit for bit, whether its key is in a full block of
    // eight (reduced together) or in a query's last partial block.
    for (const KernelTable* kt : ops::detail::runnable_tables()) {
      std::vector<float> s(3 * L[0], -1.f);
      const float* qs[3] = {q.data(), q.data() + hd, q.data() + 2 * hd};
      float* ss[3] = {s.data(), s.data() + L[0], s.data() + 2 * L[0]};
      kt->scores(qs, L, 3, K.data(), hd, 0.125f, ss);
      for (int i = 0; i < 3; ++i)
        for (int64_t j = 0; j < L[0]; ++j) {
          const float want = j < L[i] ? kt->dot(qs[i], K.data() + j * hd, hd) * 0.125f : -1.f;
          ASSERT_EQ(std::bit_cast<uint32_t>(ss[i][j]), std::bit_cast<uint32_t>(want))
              << ops::to_string(kt->level) << " hd " << hd << " query " << i << " key " << j;
        }
    }
  }
}

TEST(KernelLevels, SoftmaxAndPvEqualPortable) {
  std::mt19937 rng(2);
  for (int64_t L : {1, 2, 15, 16, 17, 33, 100, 513}) {
    auto s = randn(L, rng, 8.f);
    s[L / 2] = -200.f;  // below exp's clamp
    expect_every_level_equal("softmax_num", [&](const KernelTable& kt) {
      auto p = s;
      const float sum = kt.softmax_num(p.data(), L);
      p.push_back(sum);
      return p;
    });
    for (int64_t hd : {16, 24, 64, 256}) {
      const auto p = randn(2 * L, rng), V = randn(L * hd, rng), acc0 = randn(2 * hd, rng);
      expect_every_level_equal("pv", [&](const KernelTable& kt) {
        auto acc = acc0;
        const float* ps[2] = {p.data(), p.data() + L};
        float* as[2] = {acc.data(), acc.data() + hd};
        kt.pv(ps, 2, V.data(), 0, L / 2, hd, as);
        kt.pv(ps + 1, 1, V.data(), L / 2, L, hd, as + 1);
        return acc;
      });
    }
  }
}

TEST(KernelLevels, NormRopeAndActivationsEqualPortable) {
  std::mt19937 rng(3);
  for (int64_t D : {16, 40, 64, 576, 640, 2048}) {
    auto x = randn(D, rng, 4.f);
    x[0] = 0.f;
    x[D - 1] = 1e-30f;
    const auto w = randn(D, rng), u = randn(D, rng);
    expect_every_level_equal("rmsnorm", [&](const KernelTable& kt) {
      std::vector<float> out(D);
      kt.rmsnorm(x.data(), w.data(), D, 1e-6f, out.data());
      return out;
    });
    expect_every_level_equal("silu_mul", [&](const KernelTable& kt) {
      std::vector<float> out(D);
      kt.silu_mul(x.data(), u.data(), D, out.data());
      return out;
    });
    expect_every_level_equal("gelu_tanh_mul", [&](const KernelTable& kt) {
      std::vector<float> out(D);
      kt.gelu_tanh_mul(x.data(), u.data(), D, out.data());
      return out;
    });
    const auto logits = randn(D, rng, 40.f);
    expect_every_level_equal("softcap", [&](const KernelTable& kt) {
      auto y = logits;
      kt.softcap(y.data(), D, 30.f);
      return y;
    });
    const auto cs = randn(D, rng);
    expect_every_level_equal("rope", [&](const KernelTable& kt) {
      auto v = x;
      kt.rope(v.data(), cs.data(), D / 2);
      return v;
    });
  }
}

// ---- bf16 products and activation codes ---------------------------------------------------

TEST(KernelLevels, Bf16BlockEqualsPortable) {
  std::mt19937 rng(4);
  // A bf16 product is exact in fp32 unless it falls below 2^-126, so a
  // fused multiply-add changes results only there: the tiny scale (products
  // near 1e-40) is what would catch one.
  for (const float scale : {1.f, 1e-20f}) {
    for (int64_t K : {32, 64, 576}) {
      for (int rows : {1, 2, 3, 4, 6, 7, 16}) {
        for (int64_t N : {1, 2, 3, 4, 5, 7, 9}) {  // every activation-row tile and remainder
          std::vector<uint16_t> x(N * K), W(rows * K);
          for (auto& v : x) v = ops::f32_to_bf16(scale * std::normal_distribution<float>(0.f, 2.f)(rng));
          for (auto& v : W) v = ops::f32_to_bf16(scale * std::normal_distribution<float>(0.f, 0.1f)(rng));
          expect_every_level_equal("bf16_block", [&](const KernelTable& kt) {
            const int64_t ldy = rows + 3;
            std::vector<float> y(N * ldy, -7.f);
            kt.bf16_block(x.data(), N, W.data(), rows, K, y.data(), ldy, nullptr);
            return y;
          });
        }
      }
    }
  }
}

TEST(KernelLevels, Quantize32EqualsPortable) {
  std::mt19937 rng(5);
  const int64_t nb = 24;
  auto v = randn(nb * 32, rng, 5.f);
  for (int j = 0; j < 32; ++j) v[j] = 0.f;                      // an all-zero block
  for (int j = 0; j < 32; ++j) v[32 + j] = j == 0 ? 127.f : (j - 16) + 0.5f;  // codes on exact ties
  v[64] = 1e-38f;                                                // a tiny block maximum
  for (int j = 0; j < 32; ++j) v[96 + j] = j % 2 ? -3e4f : 1.f;  // large magnitudes
  auto run = [&](const KernelTable& kt) {
    std::vector<int8_t> codes(nb * 32);
    std::vector<float> d(nb);
    kt.quantize32(v.data(), nb, codes.data(), d.data());
    std::vector<float> out(d);
    for (int8_t c : codes) out.push_back(static_cast<float>(c));
    return out;
  };
  expect_every_level_equal("quantize32", run);
  // The tie block: max |v| = 127, so id = 1 and d = 1; codes round half to even.
  const auto p = run(kPortableKernels);
  EXPECT_EQ(p[0], 0.f);
  EXPECT_EQ(p[1], 1.f);
  EXPECT_EQ(p[nb + 32 + 0], 127.f);
  EXPECT_EQ(p[nb + 32 + 1], -14.f);   // -14.5
  EXPECT_EQ(p[nb + 32 + 2], -14.f);   // -13.5
  EXPECT_EQ(p[nb + 32 + 16], 0.f);    // 0.5
  EXPECT_EQ(p[nb + 32 + 17], 2.f);    // 1.5
}

// ---- the portable kernels against double precision ------------------------------------------

TEST(KernelLevels, ExpSiluGeluAndTanhMatchDoublePrecision) {
  std::vector<float> g, one;
  for (float x = -20.f; x <= 20.f; x += 0.0137f) g.push_back(x);
  one.assign(g.size(), 1.f);
  const int64_t n = static_cast<int64_t>(g.size());
  std::vector<float> silu(n), gelu(n);
  kPortableKernels.silu_mul(g.data(), one.data(), n, silu.data());
  kPortableKernels.gelu_tanh_mul(g.data(), one.data(), n, gelu.data());
  auto capped = g;
  kPortableKernels.softcap(capped.data(), n, 5.f);
  for (int64_t i = 0; i < n; ++i) {
    const double x = g[i];
    const double s = x / (1.0 + std::exp(-x));
    const double ge = 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    const double sc = 5.0 * std::tanh(x / 5.0);
    ASSERT_NEAR(silu[i], s, 4e-7 * std::fabs(s) + 1e-30) << x;
    ASSERT_NEAR(gelu[i], ge, 4e-7 * std::fabs(ge) + 1e-7) << x;
    ASSERT_NEAR(capped[i], sc, 3e-7 * 5.0) << x;
  }
  // Softmax numerators: exp(s - max) within 2 ulp over the clamp's range.
  std::vector<float> s;
  for (float x = -86.f; x <= 0.f; x += 0.013f) s.push_back(x);
  s.push_back(0.f);
  auto p = s;
  const float sum = kPortableKernels.softmax_num(p.data(), static_cast<int64_t>(p.size()));
  double dsum = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const double e = std::exp(static_cast<double>(s[i]));
    dsum += e;
    ASSERT_NEAR(p[i], e, 2.5e-7 * e) << s[i];
  }
  EXPECT_NEAR(sum, dsum, 1e-6 * dsum);
}

}  // namespace
