// Properties every target family must have, checked on any TargetModel:
// shapes, a multi-token forward equal to token-by-token decoding (cached vs
// uncached), rollback (trim) then re-forward equal to a fresh prefill, a ragged
// batch equal to each sequence alone (all bitwise), hidden taps, and errors
// that leave the caches untouched. Used by the family suite (tiny random
// models of every family) and by the real-model tests.
//
// Header-only (the test binary is built from tests/*_test.cpp alone).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/model/target.hpp"
#include "dspark/ops/kernels.hpp"

namespace dspark::test {

using dspark::ForwardOut;
using dspark::ForwardSeq;
using dspark::InvalidArgument;
using dspark::KVCache;
using dspark::Logits;
using dspark::TapRequest;
using dspark::TargetModel;
using dspark::TokenId;

// Bitwise equality of two fp32 tensors; on failure reports how many elements
// differ and by how much.
inline ::testing::AssertionResult same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined()) return ::testing::AssertionFailure() << "undefined tensor";
  if (a.sizes() != b.sizes())
    return ::testing::AssertionFailure() << "shapes differ: " << a.sizes() << " vs " << b.sizes();
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  if (std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.nbytes()) == 0) return ::testing::AssertionSuccess();
  const at::Tensor diff = (ac.to(at::kDouble) - bc.to(at::kDouble)).abs();
  return ::testing::AssertionFailure() << "not bitwise equal: " << (ac != bc).sum().item<int64_t>() << " of "
                                       << ac.numel() << " elements differ, max |diff| "
                                       << diff.max().item<double>();
}

inline std::vector<TokenId> slice(const std::vector<TokenId>& v, size_t b, size_t e) {
  return std::vector<TokenId>(v.begin() + static_cast<std::ptrdiff_t>(b), v.begin() + static_cast<std::ptrdiff_t>(e));
}

inline std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// (a) One multi-token forward equals the same tokens fed one at a time.
inline void check_prefill_equals_incremental(TargetModel& m, const std::vector<TokenId>& toks) {
  const int64_t T = static_cast<int64_t>(toks.size());
  KVCache c1 = m.new_cache();
  const ForwardOut all = m.forward_one(c1, toks, Logits::All);
  ASSERT_TRUE(all.logits.defined());
  ASSERT_EQ(all.logits.sizes(), (at::IntArrayRef{T, m.info().vocab}));
  EXPECT_EQ(all.logits.scalar_type(), at::kFloat);
  EXPECT_EQ(c1.size(), T);
  EXPECT_TRUE(at::isfinite(all.logits).all().item<bool>());

  KVCache c2 = m.new_cache();
  for (int64_t t = 0; t < T; ++t) {
    const ForwardOut one = m.forward_one(c2, std::span<const TokenId>(&toks[t], 1), Logits::Last);
    ASSERT_EQ(one.logits.sizes(), (at::IntArrayRef{1, m.info().vocab}));
    EXPECT_TRUE(same_bits(one.logits, all.logits.narrow(0, t, 1))) << "position " << t;
    EXPECT_TRUE(at::allclose(one.logits, all.logits.narrow(0, t, 1), 1e-4, 1e-4)) << "position " << t;
  }
  EXPECT_EQ(c2.size(), T);

  // Logits::Last of a multi-token call is the last row of Logits::All, and
  // Logits::None returns nothing but still fills the cache.
  KVCache c3 = m.new_cache();
  const ForwardOut last = m.forward_one(c3, toks, Logits::Last);
  EXPECT_TRUE(same_bits(last.logits, all.logits.narrow(0, T - 1, 1)));
  KVCache c4 = m.new_cache();
  const ForwardOut none = m.forward_one(c4, toks, Logits::None);
  EXPECT_FALSE(none.logits.defined());
  EXPECT_EQ(c4.size(), T);
  // Chunked prefill: 3 tokens, then the rest.
  KVCache c5 = m.new_cache();
  m.forward_one(c5, slice(toks, 0, 3), Logits::None);
  const ForwardOut rest = m.forward_one(c5, slice(toks, 3, toks.size()), Logits::All);
  EXPECT_TRUE(same_bits(rest.logits, all.logits.narrow(0, 3, T - 3)));
}

// (b) Forward, trim(n), forward other tokens == fresh prefill of the result.
inline void check_trim_then_reforward(TargetModel& m, const std::vector<TokenId>& prefix,
                               const std::vector<TokenId>& rejected, const std::vector<TokenId>& accepted) {
  KVCache c = m.new_cache();
  m.forward_one(c, concat(prefix, rejected), Logits::All);
  c.trim(static_cast<int64_t>(rejected.size()));
  EXPECT_EQ(c.size(), static_cast<int64_t>(prefix.size()));
  const ForwardOut after = m.forward_one(c, accepted, Logits::All);

  KVCache fresh = m.new_cache();
  const ForwardOut ref = m.forward_one(fresh, concat(prefix, accepted), Logits::All);
  EXPECT_EQ(c.size(), fresh.size());
  EXPECT_TRUE(same_bits(after.logits, ref.logits.narrow(0, static_cast<int64_t>(prefix.size()),
                                                        static_cast<int64_t>(accepted.size()))));
  // Continuing both caches with one more token stays identical.
  const TokenId next = accepted.front();
  EXPECT_TRUE(same_bits(m.forward_one(c, std::span<const TokenId>(&next, 1), Logits::Last).logits,
                        m.forward_one(fresh, std::span<const TokenId>(&next, 1), Logits::Last).logits));
  // Trimming everything and starting over equals a fresh cache too.
  c.trim(c.size());
  EXPECT_TRUE(same_bits(m.forward_one(c, prefix, Logits::All).logits,
                        ref.logits.narrow(0, 0, static_cast<int64_t>(prefix.size()))));
}

// (c) A ragged batch with different caches equals each sequence alone.
inline void check_batch_equals_alone(TargetModel& m, const std::vector<std::vector<TokenId>>& history,
                              const std::vector<std::vector<TokenId>>& fresh_tokens,
                              const TapRequest& taps) {
  const size_t S = history.size();
  std::vector<KVCache> batch_caches, alone_caches;
  for (size_t s = 0; s < S; ++s) {
    KVCache c = m.new_cache();
    if (!history[s].empty()) m.forward_one(c, history[s], Logits::None);
    batch_caches.push_back(c);
    alone_caches.push_back(c);
  }
  const Logits modes[] = {Logits::All, Logits::Last, Logits::All, Logits::None};
  std::vector<ForwardSeq> seqs;
  for (size_t s = 0; s < S; ++s) seqs.push_back(ForwardSeq{&batch_caches[s], fresh_tokens[s], modes[s % 4]});
  const std::vector<ForwardOut> outs = m.forward(seqs, taps);
  ASSERT_EQ(outs.size(), S);
  for (size_t s = 0; s < S; ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s));
    const ForwardOut alone = m.forward_one(alone_caches[s], fresh_tokens[s], modes[s % 4], taps);
    EXPECT_EQ(batch_caches[s].size(), alone_caches[s].size());
    EXPECT_EQ(batch_caches[s].size(), static_cast<int64_t>(history[s].size() + fresh_tokens[s].size()));
    if (modes[s % 4] == Logits::None) {
      EXPECT_FALSE(outs[s].logits.defined());
      EXPECT_FALSE(alone.logits.defined());
    } else {
      EXPECT_TRUE(same_bits(outs[s].logits, alone.logits)) << "logits";
    }
    if (!taps.layers.empty()) {
      EXPECT_TRUE(same_bits(outs[s].taps, alone.taps)) << "taps";
    }
    if (taps.final_hidden) {
      EXPECT_TRUE(same_bits(outs[s].final_hidden, alone.final_hidden)) << "final_hidden";
    }
  }
}

// (d) Hidden taps: shapes, consistency with the LM head and the output norm.
inline void check_taps(TargetModel& m, const std::vector<TokenId>& toks, const std::vector<int>& layers) {
  const int64_t T = static_cast<int64_t>(toks.size()), d = m.info().hidden,
                L = static_cast<int64_t>(layers.size());
  KVCache c0 = m.new_cache();
  const ForwardOut plain = m.forward_one(c0, toks, Logits::All);
  EXPECT_FALSE(plain.taps.defined());
  EXPECT_FALSE(plain.final_hidden.defined());

  KVCache c1 = m.new_cache();
  const ForwardOut out = m.forward_one(c1, toks, Logits::All, TapRequest{layers, true});
  ASSERT_TRUE(out.taps.defined());
  ASSERT_TRUE(out.final_hidden.defined());
  EXPECT_EQ(out.taps.sizes(), (at::IntArrayRef{T, L * d}));
  EXPECT_EQ(out.final_hidden.sizes(), (at::IntArrayRef{T, d}));
  EXPECT_EQ(out.taps.scalar_type(), at::kFloat);
  EXPECT_EQ(out.final_hidden.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::isfinite(out.taps).all().item<bool>());
  // Taps do not change the logits.
  EXPECT_TRUE(same_bits(out.logits, plain.logits));

  // The LM head applied to final_hidden reproduces the logits bit for bit.
  at::Tensor logits = at::empty({T, m.info().vocab}, at::kFloat);
  m.head().forward(out.final_hidden.data_ptr<float>(), T, logits.data_ptr<float>(), m.info().vocab);
  EXPECT_TRUE(same_bits(logits, out.logits));
  // ...and is close to the dequantized head's exact product: bf16 rounding of
  // the input moves a logit by ~1e-3; int8 activation blocks (quantized
  // compute) by up to about half a logit on SmolLM2, whose final hidden
  // has large outlier dimensions. A wrong head or norm moves logits by units.
  const bool int8 = m.info().compute == "quant" && m.head().quantized();
  const at::Tensor h = int8 ? out.final_hidden : out.final_hidden.to(at::kBFloat16).to(at::kFloat);
  const at::Tensor exact = at::matmul(h, m.lm_head().to(at::kFloat).t());
  const double tol = int8 ? 1.0 : 1e-3;
  EXPECT_TRUE(at::allclose(exact, out.logits, 1e-4, tol)) << "max |diff| " << (exact - out.logits).abs().max().item<double>();

  // The last layer's output, RMS-normed with the output norm, is final_hidden.
  KVCache c2 = m.new_cache();
  const int last = static_cast<int>(m.info().n_layers) - 1;
  const ForwardOut lt = m.forward_one(c2, toks, Logits::None, TapRequest{{last}, false});
  ASSERT_EQ(lt.taps.sizes(), (at::IntArrayRef{T, d}));
  EXPECT_FALSE(lt.final_hidden.defined());
  const at::Tensor x = lt.taps.to(at::kDouble);
  const at::Tensor normed =
      x * at::rsqrt(x.pow(2).mean({1}, true) + m.info().rms_eps) * m.output_norm().to(at::kDouble);
  EXPECT_TRUE(at::allclose(normed, out.final_hidden.to(at::kDouble), 1e-4, 1e-5))
      << "max |diff| " << (normed - out.final_hidden.to(at::kDouble)).abs().max().item<double>();
  at::Tensor kern = at::empty({T, d}, at::kFloat);
  const at::Tensor tap_c = lt.taps.contiguous();
  dspark::ops::rmsnorm_f32(tap_c.data_ptr<float>(), m.output_norm().data_ptr<float>(), T, d,
                               static_cast<float>(m.info().rms_eps), kern.data_ptr<float>());
  EXPECT_TRUE(same_bits(kern, out.final_hidden));

  // Layers come back in the requested order: reversing the request reverses the blocks.
  std::vector<int> reversed(layers.rbegin(), layers.rend());
  KVCache c3 = m.new_cache();
  const ForwardOut rev = m.forward_one(c3, toks, Logits::None, TapRequest{reversed, false});
  for (int64_t i = 0; i < L; ++i)
    EXPECT_TRUE(same_bits(rev.taps.narrow(1, i * d, d), out.taps.narrow(1, (L - 1 - i) * d, d))) << "block " << i;
  // Only final_hidden.
  KVCache c4 = m.new_cache();
  const ForwardOut fh = m.forward_one(c4, toks, Logits::Last, TapRequest{{}, true});
  EXPECT_FALSE(fh.taps.defined());
  EXPECT_TRUE(same_bits(fh.final_hidden, out.final_hidden));
}

// (e) Errors leave every cache unchanged.
inline void check_errors(TargetModel& m) {
  const int64_t V = m.info().vocab;
  KVCache c = m.new_cache(8);
  const std::vector<TokenId> six = {5, 6, 7, 8, 9, 10};
  m.forward_one(c, six, Logits::Last);
  ASSERT_EQ(c.size(), 6);
  const std::vector<TokenId> three = {1, 2, 3};
  try {
    m.forward_one(c, three, Logits::Last);
    ADD_FAILURE() << "context overflow accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("context length exceeded"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("9"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c.size(), 6);
  // In a batch, the other sequence's cache is untouched as well.
  KVCache other = m.new_cache();
  m.forward_one(other, three, Logits::None);
  std::vector<ForwardSeq> batch = {{&other, three, Logits::Last}, {&c, three, Logits::Last}};
  EXPECT_THROW(m.forward(batch), InvalidArgument);
  EXPECT_EQ(other.size(), 3);
  EXPECT_EQ(c.size(), 6);

  for (TokenId bad : {static_cast<TokenId>(V), static_cast<TokenId>(-1), static_cast<TokenId>(V + 1000)}) {
    const std::vector<TokenId> toks = {1, bad};
    try {
      m.forward_one(c, toks, Logits::Last);
      ADD_FAILURE() << "token " << bad << " accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
    EXPECT_EQ(c.size(), 6);
  }
  const int nl = static_cast<int>(m.info().n_layers);
  EXPECT_THROW(m.forward_one(c, std::vector<TokenId>{1}, Logits::Last, TapRequest{{nl}, false}), InvalidArgument);
  EXPECT_THROW(m.forward_one(c, std::vector<TokenId>{1}, Logits::Last, TapRequest{{-1}, false}), InvalidArgument);
  EXPECT_EQ(c.size(), 6);
  // Exactly filling the context works; the next token does not fit.
  m.forward_one(c, std::vector<TokenId>{1, 2}, Logits::Last);
  EXPECT_EQ(c.size(), 8);
  EXPECT_THROW(m.forward_one(c, std::vector<TokenId>{1}, Logits::Last), InvalidArgument);
  EXPECT_EQ(c.size(), 8);
  // Trimming more than the cache holds is rejected.
  EXPECT_THROW(c.trim(9), InvalidArgument);
  EXPECT_THROW(c.trim(-1), InvalidArgument);
  EXPECT_EQ(c.size(), 8);
}

// Logits `got` [T, V] against an independent double-precision reference:
// within 2% of the largest reference logit, and the same argmax wherever the
// reference's top two are further apart than 4x the largest error.
inline void expect_close_to_reference(const at::Tensor& got_logits, const at::Tensor& ref) {
  const at::Tensor got = got_logits.to(at::kDouble);
  const double err = (got - ref).abs().max().item<double>(), scale = ref.abs().max().item<double>();
  EXPECT_LT(err, 0.02 * scale) << "max |diff| " << err << " for logits up to " << scale;
  const at::Tensor top2 = std::get<0>(ref.topk(2, 1));
  for (int64_t t = 0; t < ref.size(0); ++t) {
    if ((top2[t][0] - top2[t][1]).item<double>() > 4 * err) {
      EXPECT_EQ(got[t].argmax().item<int64_t>(), ref[t].argmax().item<int64_t>()) << "position " << t;
    }
  }
}

}  // namespace dspark::test
