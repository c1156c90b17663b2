// Tests for the CPU forward-pass kernels: each kernel against a naive
// double-precision reference (ATen or hand-written) on random inputs, a few
// hand-computed cases, and batch invariance — a row's result must be
// bitwise identical whatever batch it is computed in and however many threads
// run, which greedy speculative decoding relies on.
#include "dspark/ops/kernels.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "test_util.hpp"

namespace {

namespace k = dspark::ops;

using dspark::test::ThreadCount;

std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = k::f32_to_bf16(v[i]);
  return out;
}

std::vector<uint16_t> randn_bf16(size_t n, std::mt19937& rng) { return to_bf16(randn(n, rng)); }

// ---- bf16 conversion -------------------------------------------------------------

TEST(KernelsBf16, RoundToNearestEven) {
  auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  };
  EXPECT_EQ(k::f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(k::f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);          // tie -> even (down)
  EXPECT_EQ(k::f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);      // tie -> even (up)
  EXPECT_EQ(k::f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);  // above the tie
  EXPECT_EQ(k::f32_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(k::f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(k::f32_to_bf16(3.4e38f), 0x7F80);  // rounds up to infinity
  EXPECT_TRUE(std::isnan(k::bf16_to_f32(k::f32_to_bf16(std::nanf("")))));
  // A NaN whose payload lives only in the low bits stays NaN.
  uint32_t low_nan = 0x7F800001u;
  float f;
  std::memcpy(&f, &low_nan, 4);
  EXPECT_TRUE(std::isnan(k::bf16_to_f32(k::f32_to_bf16(f))));
  EXPECT_EQ(bits(k::bf16_to_f32(0x3F81)), 0x3F810000u);

  // Agrees with c10::BFloat16 on random finite values of every magnitude.
  std::mt19937 rng(1);
  for (int i = 0; i < 100000; ++i) {
    uint32_t u = rng();
    if ((u & 0x7F800000u) == 0x7F800000u) continue;  // skip inf/NaN
    std::memcpy(&f, &u, 4);
    ASSERT_EQ(k::f32_to_bf16(f), c10::BFloat16(f).x) << std::hex << u;
    ASSERT_EQ(bits(k::bf16_to_f32(k::f32_to_bf16(f))), static_cast<uint32_t>(c10::BFloat16(f).x) << 16);
  }
}

// ---- linear_bf16 -------------------------------------------------------------------

// y = x W^T in double from the bf16 inputs; also the sum of |x_k w_k| per
// output as the scale of the fp32 accumulation error.
void linear_reference(const std::vector<uint16_t>& x, const std::vector<uint16_t>& W, int64_t N,
                      int64_t O, int64_t K, std::vector<double>& y, std::vector<double>& mag) {
  y.assign(static_cast<size_t>(N * O), 0.0);
  mag.assign(static_cast<size_t>(N * O), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) {
      double s = 0, m = 0;
      for (int64_t kk = 0; kk < K; ++kk) {
        const double p = static_cast<double>(k::bf16_to_f32(x[n * K + kk])) *
                         static_cast<double>(k::bf16_to_f32(W[o * K + kk]));
        s += p;
        m += std::fabs(p);
      }
      y[n * O + o] = s;
      mag[n * O + o] = m;
    }
}

TEST(KernelsLinear, MatchesDoubleReference) {
  struct Case {
    int64_t N, O, K;
  };
  const Case cases[] = {{1, 1, 32},  {1, 4, 64},   {2, 3, 32},   {3, 5, 64},   {4, 8, 96},
                        {5, 7, 128}, {7, 13, 160}, {8, 2, 256},  {13, 33, 256}, {5, 3, 1024},
                        {17, 6, 32}, {6, 11, 576}, {9, 1, 1536}};
  std::mt19937 rng(7);
  for (const auto& c : cases) {
    SCOPED_TRACE("N=" + std::to_string(c.N) + " O=" + std::to_string(c.O) + " K=" + std::to_string(c.K));
    const auto x = randn_bf16(static_cast<size_t>(c.N * c.K), rng);
    const auto W = randn_bf16(static_cast<size_t>(c.O * c.K), rng);
    const int64_t ldy = c.O + 3;  // padded rows: the padding must stay untouched
    std::vector<float> y(static_cast<size_t>(c.N * ldy), -12345.f);
    k::linear_bf16(x.data(), c.N, W.data(), c.O, c.K, y.data(), ldy);
    std::vector<double> ref, mag;
    linear_reference(x, W, c.N, c.O, c.K, ref, mag);
    for (int64_t n = 0; n < c.N; ++n) {
      for (int64_t o = 0; o < c.O; ++o) {
        const double r = ref[n * c.O + o], tol = 1e-5 * mag[n * c.O + o] + 1e-6;
        ASSERT_NEAR(y[n * ldy + o], r, tol) << "n=" << n << " o=" << o;
      }
      for (int64_t o = c.O; o < ldy; ++o) ASSERT_EQ(y[n * ldy + o], -12345.f) << "padding overwritten";
    }
  }
}

TEST(KernelsLinear, AgreesWithAtenMatmul) {
  std::mt19937 rng(11);
  const int64_t N = 6, O = 50, K = 192;
  const auto x = randn_bf16(N * K, rng), W = randn_bf16(O * K, rng);
  std::vector<float> y(N * O);
  k::linear_bf16(x.data(), N, W.data(), O, K, y.data(), O);
  auto as_tensor = [](const std::vector<uint16_t>& v, int64_t r, int64_t c) {
    return at::from_blob(const_cast<uint16_t*>(v.data()), {r, c}, at::kShort)
        .view(at::kBFloat16)
        .to(at::kDouble);
  };
  const at::Tensor ref = at::matmul(as_tensor(x, N, K), as_tensor(W, O, K).t());
  const at::Tensor got = at::from_blob(y.data(), {N, O}, at::kFloat).to(at::kDouble);
  EXPECT_TRUE(at::allclose(got, ref, 1e-4, 1e-4)) << (got - ref).abs().max().item<double>();
}

TEST(KernelsLinear, KNotMultipleOf32Throws) {
  std::vector<uint16_t> x(64 * 4, 0), W(64 * 4, 0);
  std::vector<float> y(16);
  for (int64_t K : {1, 16, 33, 48, 63}) {
    try {
      k::linear_bf16(x.data(), 1, W.data(), 1, K, y.data(), 1);
      ADD_FAILURE() << "K=" << K << " accepted";
    } catch (const dspark::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(K)), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("multiple of 32"), std::string::npos) << e.what();
    }
  }
  // Empty products are no-ops.
  EXPECT_NO_THROW(k::linear_bf16(x.data(), 0, W.data(), 3, 32, y.data(), 3));
  EXPECT_NO_THROW(k::linear_bf16(x.data(), 2, W.data(), 0, 32, y.data(), 1));
}

// Row n of x W^T computed inside batches of every size must be bitwise equal
// to row n computed alone, for 1 and 2 threads, and for any slice of W's rows.
TEST(KernelsLinear, BatchInvariantBitwise) {
  std::mt19937 rng(3);
  const int64_t Nmax = 13, O = 37, K = 320;
  const auto x = randn_bf16(Nmax * K, rng), W = randn_bf16(O * K, rng);
  std::vector<float> alone(Nmax * O);
  {
    ThreadCount tc(1);
    for (int64_t n = 0; n < Nmax; ++n) k::linear_bf16(x.data() + n * K, 1, W.data(), O, K, alone.data() + n * O, O);
  }
  for (int threads : {1, 2}) {
    ThreadCount tc(threads);
    for (int64_t B : {1, 2, 3, 4, 5, 8, 9, 10, 11, 13}) {
      for (int64_t start = 0; start + B <= Nmax; start += (B == 13 ? 1 : 1 + B / 2)) {
        SCOPED_TRACE("threads=" + std::to_string(threads) + " B=" + std::to_string(B) +
                     " start=" + std::to_string(start));
        std::vector<float> y(B * O);
        k::linear_bf16(x.data() + start * K, B, W.data(), O, K, y.data(), O);
        for (int64_t j = 0; j < B; ++j)
          ASSERT_EQ(std::memcmp(y.data() + j * O, alone.data() + (start + j) * O, O * sizeof(float)), 0)
              << "row " << start + j;
      }
    }
    // Output slices: rows o0..o1 of W alone give the same values as inside the full W.
    for (auto [o0, o1] : {std::pair<int64_t, int64_t>{0, 1}, {1, 4}, {3, 10}, {5, 37}, {36, 37}}) {
      std::vector<float> y(8 * (o1 - o0));
      k::linear_bf16(x.data(), 8, W.data() + o0 * K, o1 - o0, K, y.data(), o1 - o0);
      for (int64_t n = 0; n < 8; ++n)
        ASSERT_EQ(std::memcmp(y.data() + n * (o1 - o0), alone.data() + n * O + o0, (o1 - o0) * sizeof(float)), 0)
            << "threads=" << threads << " slice " << o0 << ".." << o1 << " row " << n;
    }
  }
  // A large O that the thread pool splits into many tasks.
  const int64_t Obig = 1030, Kbig = 64;
  const auto Wb = randn_bf16(Obig * Kbig, rng), xb = randn_bf16(5 * Kbig, rng);
  std::vector<float> one(Obig), five(5 * Obig);
  {
    ThreadCount tc(1);
    k::linear_bf16(xb.data() + 3 * Kbig, 1, Wb.data(), Obig, Kbig, one.data(), Obig);
  }
  {
    ThreadCount tc(2);
    k::linear_bf16(xb.data(), 5, Wb.data(), Obig, Kbig, five.data(), Obig);
  }
  EXPECT_EQ(std::memcmp(one.data(), five.data() + 3 * Obig, Obig * sizeof(float)), 0);
}

// ---- rmsnorm --------------------------------------------------------------------------

TEST(KernelsRmsNorm, MatchesDoubleReference) {
  std::mt19937 rng(5);
  for (int64_t D : {16, 64, 100, 576}) {
    SCOPED_TRACE("D=" + std::to_string(D));
    const int64_t N = 5;
    auto x = randn(N * D, rng, 3.f);
    for (int64_t d = 0; d < D; ++d) x[d] *= 1e-3f;  // a tiny row: eps matters
    const auto w = randn(D, rng);
    const float eps = 1e-5f;
    std::vector<float> out(N * D);
    k::rmsnorm_f32(x.data(), w.data(), N, D, eps, out.data());
    for (int64_t n = 0; n < N; ++n) {
      double ss = 0;
      for (int64_t d = 0; d < D; ++d) ss += static_cast<double>(x[n * D + d]) * x[n * D + d];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(D) + eps);
      for (int64_t d = 0; d < D; ++d) {
        const double r = x[n * D + d] * inv * w[d];
        ASSERT_NEAR(out[n * D + d], r, 1e-5 * std::fabs(r) + 1e-6) << n << "," << d;
      }
    }
    // Row-wise: one row alone gives the same bits.
    std::vector<float> row(D);
    k::rmsnorm_f32(x.data() + 3 * D, w.data(), 1, D, eps, row.data());
    EXPECT_EQ(std::memcmp(row.data(), out.data() + 3 * D, D * sizeof(float)), 0);
  }
}

// ---- rope_pairs ------------------------------------------------------------------------

TEST(KernelsRope, HandComputedRotations) {
  // One head of 2 dims, one frequency of a quarter turn per position.
  const float quarter = static_cast<float>(std::numbers::pi / 2);
  const int64_t pos[] = {0, 1, 2, 3};
  std::vector<float> x = {1, 0, 1, 0, 1, 0, 0, 1};
  k::rope_pairs(x.data(), 4, 2, 1, 2, 2, pos, &quarter);
  EXPECT_EQ(x[0], 1.f);  // position 0: unchanged
  EXPECT_EQ(x[1], 0.f);
  EXPECT_NEAR(x[2], 0.f, 1e-6);  // (1,0) by 90 degrees -> (0,1)
  EXPECT_NEAR(x[3], 1.f, 1e-6);
  EXPECT_NEAR(x[4], -1.f, 1e-6);  // by 180 degrees -> (-1,0)
  EXPECT_NEAR(x[5], 0.f, 1e-6);
  EXPECT_NEAR(x[6], 1.f, 1e-6);  // (0,1) by 270 degrees -> (1,0)
  EXPECT_NEAR(x[7], 0.f, 1e-6);

  // Two pairs with different frequencies; rot_dim 4 of head_dim 6: the last
  // pair is not rotated.
  const float inv[] = {static_cast<float>(std::numbers::pi / 2), static_cast<float>(std::numbers::pi / 3)};
  const int64_t p1[] = {1};
  std::vector<float> y = {2, 3, 1, 1, 5, 7};
  k::rope_pairs(y.data(), 1, 6, 1, 6, 4, p1, inv);
  EXPECT_NEAR(y[0], -3.f, 1e-6);  // (2,3) by 90 degrees -> (-3, 2)
  EXPECT_NEAR(y[1], 2.f, 1e-6);
  const double c = 0.5, s = std::sqrt(3.0) / 2;  // (1,1) by 60 degrees
  EXPECT_NEAR(y[2], c - s, 1e-6);
  EXPECT_NEAR(y[3], s + c, 1e-6);
  EXPECT_EQ(y[4], 5.f);
  EXPECT_EQ(y[5], 7.f);
}

TEST(KernelsRope, MatchesReferenceOnRandomInput) {
  std::mt19937 rng(9);
  const int64_t T = 5, H = 3, hd = 16, rot = 12, stride = H * hd + 7;
  std::vector<float> inv(rot / 2);
  for (int64_t i = 0; i < rot / 2; ++i)
    inv[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / static_cast<double>(rot)));
  const int64_t pos[T] = {0, 1, 7, 100, 1234};
  const auto x0 = randn(T * stride, rng);
  auto x = x0;
  k::rope_pairs(x.data(), T, stride, H, hd, rot, pos, inv.data());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < rot / 2; ++i) {
        const int64_t a = t * stride + h * hd + 2 * i;
        const double ang = static_cast<double>(pos[t]) * inv[i];
        const double ra = x0[a] * std::cos(ang) - x0[a + 1] * std::sin(ang);
        const double rb = x0[a] * std::sin(ang) + x0[a + 1] * std::cos(ang);
        ASSERT_NEAR(x[a], ra, 1e-5) << t << "," << h << "," << i;
        ASSERT_NEAR(x[a + 1], rb, 1e-5) << t << "," << h << "," << i;
      }
      for (int64_t dd = rot; dd < hd; ++dd) {
        const int64_t a = t * stride + h * hd + dd;
        ASSERT_EQ(x[a], x0[a]) << "unrotated dim changed";
      }
    }
    for (int64_t dd = H * hd; dd < stride; ++dd) ASSERT_EQ(x[t * stride + dd], x0[t * stride + dd]) << "stride gap";
  }
  // Norm of every pair is preserved.
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < rot / 2; ++i) {
      const int64_t a = t * stride + 2 * i;
      ASSERT_NEAR(std::hypot(x[a], x[a + 1]), std::hypot(x0[a], x0[a + 1]), 1e-5);
    }
  // One token at a time gives the same bits as all tokens together.
  auto y = x0;
  for (int64_t t = 0; t < T; ++t) k::rope_pairs(y.data() + t * stride, 1, stride, H, hd, rot, pos + t, inv.data());
  EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0);
}

// ---- attention ---------------------------------------------------------------------------

struct AttnCase {
  int64_t n_past, T, H, n_kv, hd;
};

// A KV cache of capacity `cap` holding n_past + T random positions; later
// rows are NaN so that reading past the causal limit shows up.
struct AttnData {
  int64_t cap, q_stride;
  std::vector<float> q, K, V;
};

AttnData make_attn(const AttnCase& c, std::mt19937& rng) {
  AttnData a;
  const int64_t L = c.n_past + c.T;
  a.cap = L + 5;
  a.q_stride = c.H * c.hd + 3 * c.hd;  // room for other columns, as in a fused QKV row
  a.q = randn(c.T * a.q_stride, rng);
  a.K.assign(c.n_kv * a.cap * c.hd, std::nanf(""));
  a.V.assign(c.n_kv * a.cap * c.hd, std::nanf(""));
  std::normal_distribution<float> d(0.f, 1.f);
  for (int64_t g = 0; g < c.n_kv; ++g)
    for (int64_t j = 0; j < L; ++j)
      for (int64_t e = 0; e < c.hd; ++e) {
        a.K[(g * a.cap + j) * c.hd + e] = d(rng);
        a.V[(g * a.cap + j) * c.hd + e] = d(rng);
      }
  return a;
}

// softmax(Q K^T * scale + causal mask) V in double with ATen: [T, H*hd].
at::Tensor attention_reference(const AttnCase& c, const AttnData& a, double scale) {
  const int64_t L = c.n_past + c.T;
  const at::Tensor q = at::from_blob(const_cast<float*>(a.q.data()), {c.T, a.q_stride}, at::kFloat)
                           .narrow(1, 0, c.H * c.hd)
                           .to(at::kDouble)
                           .reshape({c.T, c.H, c.hd})
                           .permute({1, 0, 2});  // [H, T, hd]
  auto cache = [&](const std::vector<float>& v) {
    return at::from_blob(const_cast<float*>(v.data()), {c.n_kv, a.cap, c.hd}, at::kFloat)
        .narrow(1, 0, L)
        .to(at::kDouble)
        .repeat_interleave(c.H / c.n_kv, 0);  // [H, L, hd]: head h uses group h / (H / n_kv)
  };
  const at::Tensor K = cache(a.K), V = cache(a.V);
  at::Tensor scores = at::matmul(q, K.transpose(1, 2)) * scale;  // [H, T, L]
  const at::Tensor j = at::arange(L, at::kLong).view({1, L});
  const at::Tensor t = at::arange(c.T, at::kLong).view({c.T, 1}) + c.n_past;
  scores = scores.masked_fill(j > t, -std::numeric_limits<double>::infinity());
  const at::Tensor out = at::matmul(at::softmax(scores, -1), V);  // [H, T, hd]
  return out.permute({1, 0, 2}).reshape({c.T, c.H * c.hd});
}

TEST(KernelsAttention, MatchesAtenReference) {
  const AttnCase cases[] = {{0, 1, 4, 2, 16},  {0, 7, 4, 2, 16},  {5, 3, 4, 2, 16}, {17, 1, 6, 2, 32},
                            {9, 4, 9, 3, 64},  {3, 5, 4, 4, 20},  {0, 3, 2, 1, 8},  {40, 6, 8, 2, 64}};
  std::mt19937 rng(21);
  for (const auto& c : cases) {
    SCOPED_TRACE("n_past=" + std::to_string(c.n_past) + " T=" + std::to_string(c.T) + " H=" +
                 std::to_string(c.H) + " n_kv=" + std::to_string(c.n_kv) + " hd=" + std::to_string(c.hd));
    const AttnData a = make_attn(c, rng);
    const float scale = 1.f / std::sqrt(static_cast<float>(c.hd));
    std::vector<float> out(c.T * c.H * c.hd);
    k::attention(a.q.data(), a.q_stride, a.K.data(), a.V.data(), a.cap, c.n_past, c.T, c.H, c.n_kv,
                 c.hd, scale, out.data());
    const at::Tensor ref = attention_reference(c, a, scale);
    const double* r = ref.data_ptr<double>();
    for (int64_t i = 0; i < c.T * c.H * c.hd; ++i)
      ASSERT_NEAR(out[i], r[i], std::fabs(r[i]) * 1e-5 + 1e-5) << "element " << i;
  }
}

TEST(KernelsAttention, FirstTokenReturnsItsValue) {
  // With one key, softmax is 1: the output is V exactly.
  const AttnCase c{0, 1, 2, 1, 16};
  std::mt19937 rng(2);
  const AttnData a = make_attn(c, rng);
  std::vector<float> out(2 * 16);
  k::attention(a.q.data(), a.q_stride, a.K.data(), a.V.data(), a.cap, 0, 1, 2, 1, 16, 0.25f, out.data());
  for (int h = 0; h < 2; ++h)
    for (int e = 0; e < 16; ++e) EXPECT_EQ(out[h * 16 + e], a.V[e]) << h << "," << e;
}

TEST(KernelsAttention, NoQueriesWritesNothing) {
  const AttnCase c{3, 1, 2, 1, 16};
  std::mt19937 rng(3);
  const AttnData a = make_attn(c, rng);
  std::vector<float> out(2 * 16, -5.f);
  k::attention(a.q.data(), a.q_stride, a.K.data(), a.V.data(), a.cap, 3, 0, 2, 1, 16, 0.25f, out.data());
  for (float v : out) EXPECT_EQ(v, -5.f);
}

// T queries in one call give the same bits as one call per query (with the
// cache already holding every key), for 1 and 2 threads.
TEST(KernelsAttention, BatchInvariantBitwise) {
  std::mt19937 rng(4);
  for (const AttnCase& c : {AttnCase{6, 9, 9, 3, 64}, AttnCase{0, 13, 4, 2, 16}, AttnCase{30, 5, 6, 2, 32}}) {
    const AttnData a = make_attn(c, rng);
    const float scale = 1.f / std::sqrt(static_cast<float>(c.hd));
    const int64_t row = c.H * c.hd;
    std::vector<float> single(c.T * row);
    {
      ThreadCount tc(1);
      for (int64_t t = 0; t < c.T; ++t)
        k::attention(a.q.data() + t * a.q_stride, a.q_stride, a.K.data(), a.V.data(), a.cap, c.n_past + t, 1,
                     c.H, c.n_kv, c.hd, scale, single.data() + t * row);
    }
    for (int threads : {1, 2}) {
      ThreadCount tc(threads);
      std::vector<float> all(c.T * row);
      k::attention(a.q.data(), a.q_stride, a.K.data(), a.V.data(), a.cap, c.n_past, c.T, c.H, c.n_kv, c.hd,
                   scale, all.data());
      EXPECT_EQ(std::memcmp(all.data(), single.data(), all.size() * sizeof(float)), 0)
          << "threads=" << threads << " n_past=" << c.n_past << " T=" << c.T;
      // A suffix of the queries on its own (as after a partial acceptance).
      const int64_t skip = c.T / 2;
      std::vector<float> tail((c.T - skip) * row);
      k::attention(a.q.data() + skip * a.q_stride, a.q_stride, a.K.data(), a.V.data(), a.cap, c.n_past + skip,
                   c.T - skip, c.H, c.n_kv, c.hd, scale, tail.data());
      EXPECT_EQ(std::memcmp(tail.data(), single.data() + skip * row, tail.size() * sizeof(float)), 0)
          << "threads=" << threads;
    }
  }
}

// ---- silu_mul, add_rows --------------------------------------------------------------------

TEST(KernelsSiluMul, MatchesDoubleReference) {
  std::mt19937 rng(6);
  const int64_t N = 4, F = 96;
  auto gu = randn(N * 2 * F, rng, 4.f);
  gu[0] = -100.f;  // silu saturates to -0
  gu[1] = 100.f;   // silu(x) = x
  std::vector<float> out(N * F);
  k::silu_mul(gu.data(), N, F, out.data());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < F; ++f) {
      const double g = gu[n * 2 * F + f], u = gu[n * 2 * F + F + f];
      const double r = g / (1.0 + std::exp(-g)) * u;
      ASSERT_NEAR(out[n * F + f], r, std::fabs(r) * 1e-6 + 1e-6) << n << "," << f;
    }
}

TEST(KernelsAddRows, AddsWithStride) {
  std::vector<float> x = {1, 2, 3, 4, 5, 6};
  const std::vector<float> y = {10, 20, 30, -1, 40, 50, 60, -1};
  k::add_rows(x.data(), y.data(), 2, 3, 4);
  EXPECT_EQ(x, (std::vector<float>{11, 22, 33, 44, 55, 66}));
}

}  // namespace

// weighted_rows: acc[d] + p[0]·rows[0, d] + p[1]·rows[1, d] + ..., added in
// order; values exact in binary so the sums are hand-checkable.
TEST(KernelsWeightedRows, HandComputedAndAccumulates) {
  const float p[3] = {0.5f, -2.f, 0.25f};
  std::vector<float> rows(3 * 19);
  for (int j = 0; j < 3; ++j)
    for (int d = 0; d < 19; ++d) rows[j * 19 + d] = static_cast<float>((j + 1) * (d - 9));
  std::vector<float> acc(19, 1.f);
  dspark::ops::weighted_rows(p, rows.data(), 3, 19, acc.data());
  for (int d = 0; d < 19; ++d) {
    // 1 + 0.5·(d-9) - 2·2(d-9) + 0.25·3(d-9) = 1 - 2.75·(d-9)
    EXPECT_EQ(acc[d], 1.f - 2.75f * static_cast<float>(d - 9)) << "d " << d;
  }
  // n = 0 leaves acc untouched.
  dspark::ops::weighted_rows(p, rows.data(), 0, 19, acc.data());
  EXPECT_EQ(acc[0], 1.f + 2.75f * 9.f);
}
