// Tests of the kernels the Gemma family added (ops/activations, ops/rope,
// ops/head_norm, ops/attention_window), each against a naive double-precision
// reference or hand-computed values, plus the batch invariance the decode
// path relies on.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/ops/activations.hpp"
#include "dspark/ops/attention_window.hpp"
#include "dspark/ops/head_norm.hpp"
#include "dspark/ops/kernels.hpp"
#include "dspark/ops/rope.hpp"
#include "test_util.hpp"

namespace {

namespace ops = dspark::ops;
using dspark::test::ThreadCount;

std::vector<float> randn(int64_t n, std::mt19937& rng, float stddev = 1.f) {
  std::normal_distribution<float> d(0.f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(OpsActivations, GeluTanhHandValuesAndGating) {
  // PyTorch gelu(x, approximate="tanh"): gelu(1) = 0.8411920, gelu(-1) = -0.1588080, gelu(3) = 2.9963627.
  EXPECT_NEAR(ops::gelu_tanh(1.f), 0.8411920f, 1e-6);
  EXPECT_NEAR(ops::gelu_tanh(-1.f), -0.1588080f, 1e-6);
  EXPECT_NEAR(ops::gelu_tanh(3.f), 2.9963627f, 1e-6);
  EXPECT_EQ(ops::gelu_tanh(0.f), 0.f);
  std::mt19937 rng(1);
  const int64_t N = 3, F = 37;
  const auto gu = randn(N * 2 * F, rng, 2.f);
  std::vector<float> out(static_cast<size_t>(N * F));
  ops::gelu_tanh_mul(gu.data(), N, F, out.data());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < F; ++f) {
      const double g = gu[n * 2 * F + f], u = gu[n * 2 * F + F + f];
      const double ref = 0.5 * g * (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g))) * u;
      ASSERT_NEAR(out[n * F + f], ref, 1e-5 * (1 + std::fabs(ref))) << n << "," << f;
    }
}

TEST(OpsActivations, SoftcapAndScale) {
  std::vector<float> x = {-100.f, -1.f, 0.f, 0.5f, 30.f, 1000.f};
  auto y = x;
  ops::softcap(y.data(), static_cast<int64_t>(y.size()), 30.f);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], 30.0 * std::tanh(x[i] / 30.0), 1e-4) << i;
  EXPECT_LT(y.back(), 30.0001f);
  auto z = x;
  ops::softcap(z.data(), static_cast<int64_t>(z.size()), 0.f);
  EXPECT_EQ(z, x) << "cap 0 means none";
  ops::scale(z.data(), 2, 0.5f);
  EXPECT_EQ(z[0], -50.f);
  EXPECT_EQ(z[1], -0.5f);
  EXPECT_EQ(z[2], 0.f);
}

TEST(OpsRope, InvFreqTable) {
  const auto f = ops::rope_inv_freq(10000.0, 8);
  ASSERT_EQ(f.size(), 4u);
  EXPECT_FLOAT_EQ(f[0], 1.f);
  EXPECT_FLOAT_EQ(f[1], 0.1f);
  EXPECT_FLOAT_EQ(f[3], 0.001f);
  const float factors[4] = {1, 2, 4, 8};
  const auto g = ops::rope_inv_freq(10000.0, 8, 2.0, factors);
  EXPECT_FLOAT_EQ(g[1], 0.1f / 2 / 2);
  EXPECT_FLOAT_EQ(g[3], 0.001f / 2 / 8);
}

TEST(OpsRope, HalvesRotateDimIWithDimIPlusHalf) {
  std::mt19937 rng(3);
  const int64_t T = 4, H = 3, hd = 16, rot = 12, stride = H * hd + 5;
  const auto x0 = randn(T * stride, rng);
  auto x = x0;
  const int64_t pos[T] = {0, 1, 7, 300};
  const auto inv = ops::rope_inv_freq(10000.0, rot);
  ops::rope_halves(x.data(), T, stride, H, hd, rot, pos, inv.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const float* a = x0.data() + t * stride + h * hd;
      const float* b = x.data() + t * stride + h * hd;
      for (int64_t i = 0; i < rot / 2; ++i) {
        const double ang = static_cast<double>(pos[t]) * inv[i];
        ASSERT_NEAR(b[i], a[i] * std::cos(ang) - a[i + rot / 2] * std::sin(ang), 1e-5);
        ASSERT_NEAR(b[i + rot / 2], a[i] * std::sin(ang) + a[i + rot / 2] * std::cos(ang), 1e-5);
      }
      for (int64_t dd = rot; dd < hd; ++dd) ASSERT_EQ(b[dd], a[dd]) << "unrotated dim changed";
    }
  for (int64_t dd = H * hd; dd < stride; ++dd) EXPECT_EQ(x[dd], x0[dd]) << "stride gap";
  // Position 0 is the identity.
  EXPECT_EQ(std::memcmp(x.data(), x0.data(), sizeof(float) * H * hd), 0);
}

TEST(OpsHeadNorm, EachHeadNormalizedWithSharedWeights) {
  std::mt19937 rng(5);
  const int64_t T = 3, H = 4, hd = 32, stride = H * hd + 7;
  const auto x0 = randn(T * stride, rng, 3.f);
  const auto w = randn(hd, rng);
  auto x = x0;
  ops::head_rmsnorm(x.data(), T, stride, H, hd, w.data(), 1e-6f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const float* a = x0.data() + t * stride + h * hd;
      double ss = 0;
      for (int64_t i = 0; i < hd; ++i) ss += static_cast<double>(a[i]) * a[i];
      const double inv = 1 / std::sqrt(ss / hd + 1e-6);
      for (int64_t i = 0; i < hd; ++i) ASSERT_NEAR(x[t * stride + h * hd + i], a[i] * inv * w[i], 1e-5);
    }
  for (int64_t dd = H * hd; dd < stride; ++dd) EXPECT_EQ(x[dd], x0[dd]) << "stride gap";
}

// ---- sliding-window attention over a ring ---------------------------------------------------

struct WinCase {
  int64_t n_past, T, H, n_kv, hd, window, cap;
};

// Keys/values of positions 0..n_past+T-1 written into rings of `cap` rows
// (position p in row p % cap, later positions overwriting earlier ones), the
// full history kept aside for the reference.
struct WinData {
  int64_t q_stride;
  std::vector<float> q, K, V, Kfull, Vfull;
};

WinData make_window(const WinCase& c, std::mt19937& rng) {
  WinData a;
  const int64_t L = c.n_past + c.T;
  a.q_stride = c.H * c.hd + 2 * c.hd;
  a.q = randn(c.T * a.q_stride, rng);
  a.Kfull = randn(c.n_kv * L * c.hd, rng);
  a.Vfull = randn(c.n_kv * L * c.hd, rng);
  a.K.assign(static_cast<size_t>(c.n_kv * c.cap * c.hd), std::nanf(""));
  a.V = a.K;
  for (int64_t g = 0; g < c.n_kv; ++g)
    for (int64_t p = 0; p < L; ++p) {
      std::memcpy(&a.K[(g * c.cap + p % c.cap) * c.hd], &a.Kfull[(g * L + p) * c.hd], sizeof(float) * c.hd);
      std::memcpy(&a.V[(g * c.cap + p % c.cap) * c.hd], &a.Vfull[(g * L + p) * c.hd], sizeof(float) * c.hd);
    }
  return a;
}

// softmax(q k^T scale, masked to keys p - window < j <= p) V in double: [T, H*hd].
at::Tensor window_reference(const WinCase& c, const WinData& a, double scale) {
  const int64_t L = c.n_past + c.T;
  const at::Tensor q = at::from_blob(const_cast<float*>(a.q.data()), {c.T, a.q_stride}, at::kFloat)
                           .narrow(1, 0, c.H * c.hd).to(at::kDouble).reshape({c.T, c.H, c.hd}).permute({1, 0, 2});
  auto full = [&](const std::vector<float>& v) {
    return at::from_blob(const_cast<float*>(v.data()), {c.n_kv, L, c.hd}, at::kFloat)
        .to(at::kDouble).repeat_interleave(c.H / c.n_kv, 0);
  };
  at::Tensor s = at::matmul(q, full(a.Kfull).transpose(1, 2)) * scale;  // [H, T, L]
  const at::Tensor j = at::arange(L, at::kLong).view({1, L});
  const at::Tensor p = at::arange(c.T, at::kLong).view({c.T, 1}) + c.n_past;
  s = s.masked_fill((j > p).logical_or(j <= p - c.window), -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(s, -1), full(a.Vfull)).permute({1, 0, 2}).reshape({c.T, c.H * c.hd});
}

TEST(OpsAttentionWindow, MatchesMaskedReferenceAcrossRingWraps) {
  const WinCase cases[] = {
      {0, 1, 2, 1, 16, 4, 4},     {0, 9, 2, 1, 16, 4, 12},    // window filling inside one call
      {10, 1, 4, 2, 32, 4, 4},    {37, 3, 4, 2, 32, 8, 10},   // wrapped rings, exactly as small as allowed
      {100, 5, 4, 1, 256, 16, 64}, {5, 4, 2, 2, 48, 100, 9},  // Gemma's head size; window larger than the past
  };
  std::mt19937 rng(7);
  for (const auto& c : cases) {
    SCOPED_TRACE("n_past=" + std::to_string(c.n_past) + " T=" + std::to_string(c.T) + " window=" +
                 std::to_string(c.window) + " cap=" + std::to_string(c.cap));
    const WinData a = make_window(c, rng);
    const float scale = 1.f / std::sqrt(static_cast<float>(c.hd));
    std::vector<float> out(static_cast<size_t>(c.T * c.H * c.hd));
    ops::attention_window(a.q.data(), a.q_stride, a.K.data(), a.V.data(), c.cap, c.n_past, c.T, c.H, c.n_kv, c.hd,
                          c.window, scale, out.data());
    const at::Tensor ref = window_reference(c, a, scale);
    const double* r = ref.data_ptr<double>();
    for (int64_t i = 0; i < c.T * c.H * c.hd; ++i)
      ASSERT_NEAR(out[i], r[i], std::fabs(r[i]) * 1e-5 + 1e-5) << "element " << i;
  }
}

// With a window covering the whole past it is ordinary causal attention.
TEST(OpsAttentionWindow, WideWindowEqualsCausalAttention) {
  const WinCase c{6, 5, 4, 2, 64, 1000, 11};
  std::mt19937 rng(8);
  const WinData a = make_window(c, rng);
  std::vector<float> win(static_cast<size_t>(c.T * c.H * c.hd)), full(win.size());
  ops::attention_window(a.q.data(), a.q_stride, a.K.data(), a.V.data(), c.cap, c.n_past, c.T, c.H, c.n_kv, c.hd,
                        c.window, 0.125f, win.data());
  ops::attention(a.q.data(), a.q_stride, a.K.data(), a.V.data(), c.cap, c.n_past, c.T, c.H, c.n_kv, c.hd, 0.125f,
                 full.data());
  for (size_t i = 0; i < win.size(); ++i) ASSERT_NEAR(win[i], full[i], 1e-5 * (1 + std::fabs(full[i]))) << i;
}

// T queries in one call equal one call per query, on rings of another size
// and rotation, with 1 and 2 threads: bitwise.
TEST(OpsAttentionWindow, BatchAndRingInvariantBitwise) {
  const WinCase c{40, 7, 4, 1, 64, 16, 22};
  std::mt19937 rng(9);
  const WinData a = make_window(c, rng);
  const int64_t row = c.H * c.hd;
  std::vector<float> all(static_cast<size_t>(c.T * row));
  {
    ThreadCount tc(2);
    ops::attention_window(a.q.data(), a.q_stride, a.K.data(), a.V.data(), c.cap, c.n_past, c.T, c.H, c.n_kv, c.hd,
                          c.window, 0.125f, all.data());
  }
  WinCase big = c;
  big.cap = 64;  // the same positions in a ring of another size
  WinData b = a;
  b.K.assign(static_cast<size_t>(c.n_kv * big.cap * c.hd), 0.f);
  b.V = b.K;
  for (int64_t p = 0; p < c.n_past + c.T; ++p) {
    std::memcpy(&b.K[(p % big.cap) * c.hd], &a.Kfull[p * c.hd], sizeof(float) * c.hd);
    std::memcpy(&b.V[(p % big.cap) * c.hd], &a.Vfull[p * c.hd], sizeof(float) * c.hd);
  }
  ThreadCount tc(1);
  for (int64_t t = 0; t < c.T; ++t) {
    std::vector<float> one(static_cast<size_t>(row));
    ops::attention_window(b.q.data() + t * b.q_stride, b.q_stride, b.K.data(), b.V.data(), big.cap, c.n_past + t, 1,
                          c.H, c.n_kv, c.hd, c.window, 0.125f, one.data());
    EXPECT_EQ(std::memcmp(one.data(), all.data() + t * row, sizeof(float) * row), 0) << "query " << t;
  }
}

TEST(OpsAttentionWindow, RefusesARingTooSmallForTheCall) {
  std::vector<float> q(64), K(8 * 16), V(8 * 16), out(64);
  // 3 new tokens with window 8 need 10 rows at once; 8 are given.
  EXPECT_THROW(ops::attention_window(q.data(), 16, K.data(), V.data(), 8, 20, 3, 1, 1, 16, 8, 1.f, out.data()),
               dspark::InvalidArgument);
  EXPECT_THROW(ops::attention_window(q.data(), 24, K.data(), V.data(), 8, 0, 1, 1, 1, 24, 8, 1.f, out.data()),
               dspark::InvalidArgument)
      << "head size not a multiple of 16";
}

}  // namespace
