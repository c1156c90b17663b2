// ops::Linear::from_tensor_q8_0: ggml's Q8_0 quantization of a float matrix
// (per block of 32: d = max|w| / 127 as fp16, codes round(w / d)), checked
// by hand on one block, against the GGUF dequantizer, and as a product.
#include <ATen/ATen.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/ops/linear.hpp"

using dspark::ops::Linear;

TEST(LinearQ8, OneBlockByHand) {
  // w[i] = i/2 - 8 for i < 32: max |w| = 8 (i = 0), so d = 8/127 and
  // code(i) = round((i/2 - 8) · 127/8), halves away from zero.
  std::vector<float> w(32);
  for (int i = 0; i < 32; ++i) w[i] = 0.5f * static_cast<float>(i) - 8.f;
  const Linear L = Linear::from_tensor_q8_0(at::from_blob(w.data(), {1, 32}, at::kFloat));
  EXPECT_TRUE(L.quantized());
  EXPECT_EQ(L.type_name(), "Q8_0");
  EXPECT_EQ(L.weight_bytes(), 34);
  std::vector<float> row(32);
  L.row_f32(0, row.data());
  const float d = static_cast<float>(c10::Half(8.f / 127.f));
  for (int i = 0; i < 32; ++i) {
    const long code = std::lround(static_cast<double>(w[i]) * 127.0 / 8.0);
    EXPECT_EQ(row[i], d * static_cast<float>(code)) << "i " << i;
  }
  EXPECT_EQ(row[0], d * -127.f);  // the largest magnitude takes the full code range
  EXPECT_EQ(row[16], 0.f);
  EXPECT_EQ(row[1], d * -119.f);  // -7.5 · 15.875 = -119.06
}

TEST(LinearQ8, ProductCloseToTheFloatProduct) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t O = 45, K = 96, N = 7;
  at::Tensor W = at::empty({O, K}, at::kFloat), X = at::empty({N, K}, at::kFloat);
  for (int64_t i = 0; i < O * K; ++i) W.data_ptr<float>()[i] = 0.05f * nd(rng);
  for (int64_t i = 0; i < N * K; ++i) X.data_ptr<float>()[i] = nd(rng);
  W.data_ptr<float>()[5] = 0.f;  // and an all-zero block (d = 0)
  for (int64_t k = 0; k < 32; ++k) W.data_ptr<float>()[2 * K + k] = 0.f;
  const Linear L = Linear::from_tensor_q8_0(W);
  std::vector<float> y(static_cast<size_t>(N * O));
  L.forward(X.data_ptr<float>(), N, y.data(), O);
  const at::Tensor ref = at::matmul(X.to(at::kDouble), W.to(at::kDouble).t());
  double err = 0, scale = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) {
      err = std::max(err, std::abs(y[n * O + o] - ref[n][o].item<double>()));
      scale = std::max(scale, std::abs(ref[n][o].item<double>()));
    }
  // Two 8-bit roundings (weights, activations): about 1% of the largest output.
  EXPECT_LT(err, 0.02 * scale);
  EXPECT_GT(scale, 0.1);
}

TEST(LinearQ8, RowsNotWholeBlocksAreRefused) {
  const at::Tensor W = at::zeros({4, 40});
  try {
    Linear::from_tensor_q8_0(W);
    FAIL() << "expected InvalidArgument";
  } catch (const dspark::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("40 columns, expected a multiple of 32"), std::string::npos) << e.what();
  }
}
