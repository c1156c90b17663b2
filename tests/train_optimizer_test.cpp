// Tests for the trainer's optimizers (include/dspark/train/optimizer.hpp):
//  - Newton-Schulz and three Muon + AdamW steps against an independent NumPy
//    implementation of the published algorithms (tests/golden/muon/, written
//    by scripts/golden/make_muon_golden.py), in fp64 to 1e-10 and in fp32;
//  - what NS₅ does: the singular values of its output lie near 1, its
//    singular vectors are the input's (so NS₅(U) ≈ the orthogonal factor
//    U·Vᵀ of LAPACK's SVD, within the quintic's band); a 2×3 case whose SVD
//    and iteration are computed by hand;
//  - which drafter parameters Muon takes;
//  - the state round-trips through save/load (resumed steps equal
//    uninterrupted ones), and a state of another optimizer is refused.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "train/bf16_matmul.hpp"
#include "dspark/error.hpp"
#include "dspark/speculative/drafter.hpp"
#include "dspark/train/optimizer.hpp"
#include "test_util.hpp"

namespace {

using namespace dspark;
using namespace dspark::train;
using json = nlohmann::json;

const json& golden() {
  static const json g = [] {
    std::ifstream in(DSPARK_SOURCE_DIR "/tests/golden/muon/muon_steps.json");
    return json::parse(in);
  }();
  return g;
}

at::Tensor tensor_of(const json& j, at::ScalarType dt = at::kDouble) {
  const auto shape = j.at("shape").get<std::vector<int64_t>>();
  return at::tensor(j.at("values").get<std::vector<double>>(), at::kDouble).reshape(shape).to(dt);
}

double max_rel(const at::Tensor& got, const at::Tensor& want) {
  return (got.to(at::kDouble) - want).abs().max().item<double>() / want.abs().max().item<double>();
}

TEST(TrainOptimizer, NewtonSchulzMatchesTheReference) {
  const json& g = golden();
  ASSERT_EQ(g.at("ns_coefficients").get<std::vector<double>>(), (std::vector<double>{3.4445, -4.7750, 2.0315}));
  for (const auto& c : g.at("newton_schulz")) {
    const at::Tensor in = tensor_of(c.at("input")), want = tensor_of(c.at("output"));
    SCOPED_TRACE(c10::str(in.sizes()));
    const at::Tensor got = newton_schulz(in);
    ASSERT_EQ(got.sizes(), in.sizes());
    EXPECT_EQ(got.scalar_type(), at::kDouble);
    EXPECT_LT(max_rel(got, want), 1e-12);
    EXPECT_LT(max_rel(newton_schulz(in.to(at::kFloat)), want), 1e-5);
  }
  EXPECT_THROW(newton_schulz(at::ones({3})), InvalidArgument);
}

// The trainer's bf16 products: bf16 operands, fp32 sums, a bf16 result, on
// any path (oneDNN where the CPU has it and the product is large, an fp32
// product otherwise). Against fp64 products of the same bf16 operands
// rounded once to bf16: at most one bf16 step apart, for sizes on both sides
// of ATen's oneDNN cut-off and for batched operands.
TEST(TrainOptimizer, Bf16ProductsSumInFp32AndRoundOnce) {
  at::Generator gen = at::detail::createCPUGenerator(5);
  const std::vector<std::vector<int64_t>> shapes = {{4, 64, 4}, {8, 64, 8}, {16, 16, 16}, {224, 576, 64}, {1, 2880, 576}};
  for (const auto& sh : shapes) {
    SCOPED_TRACE(c10::str(at::IntArrayRef(sh)));
    const at::Tensor a = at::empty({sh[0], sh[1]}, at::kFloat).normal_(0, 1, gen);
    const at::Tensor b = at::empty({sh[1], sh[2]}, at::kFloat).normal_(0, 1, gen);
    const at::Tensor c = at::empty({sh[0], sh[2]}, at::kFloat).normal_(0, 1, gen);
    auto r = [](const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kDouble); };
    const at::Tensor exact = at::matmul(r(a), r(b));
    const at::Tensor got = train::detail::matmul_bf16(a, b);
    EXPECT_EQ(got.scalar_type(), at::kBFloat16);
    // One bf16 step (2⁻⁸ relative) of the exact sum, plus fp32 summation error.
    const at::Tensor tol = exact.abs() * (1.0 / 256) + 1e-5 * sh[1];
    EXPECT_TRUE((got.to(at::kDouble) - exact).abs().le(tol).all().item<bool>());
    const at::Tensor want_mm = -0.5 * r(c) + 2.0 * exact;
    const at::Tensor got_mm = train::detail::addmm_bf16(c, a, b, -0.5, 2.0);
    EXPECT_TRUE((got_mm.to(at::kDouble) - want_mm).abs().le(want_mm.abs() * (1.0 / 256) + 1e-5 * sh[1]).all().item<bool>());
  }
  const at::Tensor a = at::empty({3, 5, 21, 64}, at::kFloat).normal_(0, 1, gen);
  const at::Tensor b = at::empty({3, 5, 64, 7}, at::kFloat).normal_(0, 1, gen);
  const at::Tensor exact = at::matmul(a.to(at::kBFloat16).to(at::kDouble), b.to(at::kBFloat16).to(at::kDouble));
  const at::Tensor got = train::detail::matmul_bf16(a, b).to(at::kDouble);
  EXPECT_TRUE((got - exact).abs().le(exact.abs() * (1.0 / 256) + 1e-3).all().item<bool>());
}

// NS₅ as PyTorch runs it: every product's operands and result rounded to
// bf16, its sums exact here (fp64), and the normalized input rounded too.
at::Tensor newton_schulz_bf16_reference(const at::Tensor& g) {
  auto r = [](const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kDouble); };
  const bool tall = g.size(0) > g.size(1);
  at::Tensor x = tall ? g.t().to(at::kDouble) : g.to(at::kDouble);
  x = r(x.to(at::kFloat) / x.to(at::kFloat).norm());
  for (int i = 0; i < 5; ++i) {
    const at::Tensor a = r(at::matmul(x, x.t()));
    const at::Tensor b = r(-4.7750 * a + 2.0315 * at::matmul(a, a));
    x = r(3.4445 * x + at::matmul(b, x));
  }
  return tall ? x.t() : x;
}

// In bf16 (the trainer's default) NS₅ keeps fp32 parameters fp32 and
// follows the bf16 reference above (fp32 sums instead of exact ones move a
// rounding now and then; the quintic amplifies small singular values'
// errors, so the fp64 NS₅ is up to ~10% away on these small matrices).
TEST(TrainOptimizer, NewtonSchulzInBf16FollowsTheBf16Reference) {
  for (const auto& c : golden().at("newton_schulz")) {
    const at::Tensor in = tensor_of(c.at("input"), at::kFloat), want = tensor_of(c.at("output"));
    SCOPED_TRACE(c10::str(in.sizes()));
    const at::Tensor got = newton_schulz(in, 5, 1e-7, /*bf16=*/true);
    ASSERT_EQ(got.sizes(), in.sizes());
    EXPECT_EQ(got.scalar_type(), at::kFloat);
    auto rel = [](const at::Tensor& a, const at::Tensor& b) {
      return (a.to(at::kDouble) - b).norm().item<double>() / b.norm().item<double>();
    };
    const at::Tensor ref = newton_schulz_bf16_reference(in);
    EXPECT_LT(rel(got, ref), 0.01);
    EXPECT_GT(rel(got, want), 1e-4);  // it did run in bf16, not fp32
  }
  // A larger matrix: the singular values still land in the quintic's band.
  at::Generator gen = at::detail::createCPUGenerator(9);
  const at::Tensor x = at::empty({96, 320}, at::kFloat).normal_(0, 1, gen);
  for (const at::Tensor& m : {x, x.t().contiguous()}) {
    const at::Tensor o = newton_schulz(m, 5, 1e-7, true);
    const at::Tensor sv = at::linalg_svdvals(o.to(at::kDouble));
    EXPECT_GT(sv.min().item<double>(), 0.6);
    EXPECT_LT(sv.max().item<double>(), 1.2);
    const double e = (o.to(at::kDouble) - newton_schulz_bf16_reference(m)).norm().item<double>() / o.norm().item<double>();
    EXPECT_LT(e, 0.01);
  }
}

// NS₅ pushes every singular value into about [0.68, 1.13] (Keller Jordan's
// quintic trades exactness for speed) and keeps the singular vectors: its
// output is close to U·Vᵀ of the input's SVD.
TEST(TrainOptimizer, NewtonSchulzOrthogonalizes) {
  at::Generator gen = at::detail::createCPUGenerator(4);
  for (auto shape : {std::vector<int64_t>{16, 40}, std::vector<int64_t>{40, 16}}) {
    // Singular values spread over two decades.
    const int64_t k = std::min(shape[0], shape[1]);
    const auto [q1, r1] = at::linalg_qr(at::empty({shape[0], k}, at::kDouble).normal_(0, 1, gen));
    const auto [q2, r2] = at::linalg_qr(at::empty({shape[1], k}, at::kDouble).normal_(0, 1, gen));
    const at::Tensor s = at::logspace(-2, 0, k, 10.0, at::kDouble);
    const at::Tensor x = at::matmul(q1 * s, q2.t());
    const at::Tensor o = newton_schulz(x);
    const at::Tensor sv = at::linalg_svdvals(o);
    EXPECT_GT(sv.min().item<double>(), 0.6);
    EXPECT_LT(sv.max().item<double>(), 1.2);
    // Projected on the input's singular vectors it is diagonal, with every
    // diagonal entry (the output's singular value along the input's pair)
    // positive and in the same band: no direction flipped.
    const at::Tensor d = at::matmul(at::matmul(q1.t(), o), q2);
    EXPECT_LT((d - at::diag(at::diagonal(d))).abs().max().item<double>(), 1e-10);
    EXPECT_GT(at::diagonal(d).min().item<double>(), 0.6);
    // Against the polar factor U·Vᵀ from LAPACK's SVD of the input: within
    // the quintic's band in the spectral norm (|f(σ) − 1| ≤ 0.4), and far
    // closer than the input itself scaled to unit Frobenius norm is.
    const auto [u, sv_in, vh] = at::linalg_svd(x, /*full_matrices=*/false);
    const at::Tensor polar = at::matmul(u, vh);
    const double err = at::linalg_matrix_norm(o - polar, 2).item<double>();
    EXPECT_LT(err, 0.4);
    EXPECT_GT(at::linalg_matrix_norm(x / x.norm() - polar, 2).item<double>(), 0.9);
    // More iterations of the same quintic stay in the band (it does not
    // converge to 1, it oscillates inside [0.68, 1.13]).
    EXPECT_LT(at::linalg_matrix_norm(newton_schulz(x, 10) - polar, 2).item<double>(), 0.4);
  }
}

// A hand-computed case. X = [[3, 1, 0], [1, 3, 0]] = Q·diag(4, 2)·Wᵀ with
// Q = [[1, 1], [1, −1]]/√2 and W's columns (1, 1, 0)/√2, (1, −1, 0)/√2, so
// its polar factor Q·Wᵀ is [[1, 0, 0], [0, 1, 0]]. NS₅ acts on each singular
// value alone: σ ← a·σ + b·σ³ + c·σ⁵ five times from σ/‖X‖_F (4/√20, 2/√20),
// giving f₁, f₂, and NS₅(X) = Q·diag(f₁, f₂)·Wᵀ =
// [[(f₁+f₂)/2, (f₁−f₂)/2, 0], [(f₁−f₂)/2, (f₁+f₂)/2, 0]].
TEST(TrainOptimizer, NewtonSchulzOfAHandComputedMatrix) {
  const at::Tensor x = at::tensor({3.0, 1.0, 0.0, 1.0, 3.0, 0.0}, at::kDouble).view({2, 3});
  const at::Tensor polar = at::tensor({1.0, 0.0, 0.0, 0.0, 1.0, 0.0}, at::kDouble).view({2, 3});
  const auto [u, s, vh] = at::linalg_svd(x, /*full_matrices=*/false);
  EXPECT_NEAR(s[0].item<double>(), 4.0, 1e-12);
  EXPECT_NEAR(s[1].item<double>(), 2.0, 1e-12);
  EXPECT_LT((at::matmul(u, vh) - polar).abs().max().item<double>(), 1e-12);
  auto f = [](double sigma) {
    for (int i = 0; i < 5; ++i) sigma = 3.4445 * sigma - 4.7750 * std::pow(sigma, 3) + 2.0315 * std::pow(sigma, 5);
    return sigma;
  };
  const double f1 = f(4.0 / std::sqrt(20.0)), f2 = f(2.0 / std::sqrt(20.0));
  // Both in the quintic's band around 1 (the large one pulled down, the
  // small one pushed up): about 0.689 and 1.114.
  EXPECT_NEAR(f1, 0.6888, 1e-3);
  EXPECT_NEAR(f2, 1.1142, 1e-3);
  const at::Tensor want =
      at::tensor({(f1 + f2) / 2, (f1 - f2) / 2, 0.0, (f1 - f2) / 2, (f1 + f2) / 2, 0.0}, at::kDouble).view({2, 3});
  EXPECT_LT((newton_schulz(x) - want).abs().max().item<double>(), 1e-12);
  // Tall input: the transposed problem, transposed back.
  EXPECT_LT((newton_schulz(x.t()) - want.t()).abs().max().item<double>(), 1e-12);
  // Within the band of U·Vᵀ, and scale-free (X and 1000·X give the same).
  EXPECT_LT(at::linalg_matrix_norm(newton_schulz(x) - polar, 2).item<double>(), 0.32);
  EXPECT_LT((newton_schulz(x * 1000.0) - want).abs().max().item<double>(), 1e-12);
}

TEST(TrainOptimizer, LearningRateScales) {
  EXPECT_DOUBLE_EQ(muon_lr_factor(1536, 576, MuonLrScale::Original), std::sqrt(1536.0 / 576.0));
  EXPECT_DOUBLE_EQ(muon_lr_factor(576, 1536, MuonLrScale::Original), 1.0);
  EXPECT_DOUBLE_EQ(muon_lr_factor(576, 1536, MuonLrScale::MatchRmsAdamW), 0.2 * std::sqrt(1536.0));
  EXPECT_EQ(parse_muon_lr_scale("match-rms-adamw"), MuonLrScale::MatchRmsAdamW);
  EXPECT_THROW(parse_muon_lr_scale("rms"), InvalidArgument);
  EXPECT_EQ(parse_optimizer("muon"), OptimizerKind::Muon);
  EXPECT_THROW(parse_optimizer("sgd"), InvalidArgument);
}

struct GoldenRun {
  OptimizerOptions opts;
  std::vector<std::pair<double, double>> lrs;
  std::vector<OptParam> params;  // fresh copies of the starting values
  std::vector<std::map<std::string, at::Tensor>> grads, after;
};

GoldenRun golden_run(const json& r, at::ScalarType dt) {
  GoldenRun g;
  const json& o = r.at("options");
  g.opts.kind = OptimizerKind::Muon;
  g.opts.muon_momentum = o.at("momentum").get<double>();
  g.opts.muon_nesterov = o.at("nesterov").get<bool>();
  g.opts.muon_lr_scale = parse_muon_lr_scale(o.at("lr_scale").get<std::string>());
  g.opts.weight_decay = o.at("weight_decay").get<double>();
  g.opts.beta1 = o.at("beta1").get<double>();
  g.opts.beta2 = o.at("beta2").get<double>();
  g.opts.eps = o.at("eps").get<double>();
  g.opts.muon_ns_steps = o.at("ns_steps").get<int>();
  g.opts.muon_eps = o.at("ns_eps").get<double>();
  for (const auto& lr : o.at("lr_schedule")) g.lrs.emplace_back(lr[0].get<double>(), lr[1].get<double>());
  for (const auto& [name, p] : r.at("params").items())
    g.params.push_back({name, tensor_of(p, dt).requires_grad_(true), p.at("muon").get<bool>()});
  for (const auto& step : r.at("grads")) {
    g.grads.emplace_back();
    for (const auto& [name, t] : step.items()) g.grads.back()[name] = tensor_of(t, dt);
  }
  for (const auto& step : r.at("after")) {
    g.after.emplace_back();
    for (const auto& [name, t] : step.items()) g.after.back()[name] = tensor_of(t);
  }
  return g;
}

void set_grads(std::vector<OptParam>& params, const std::map<std::string, at::Tensor>& grads) {
  for (auto& p : params) p.tensor.mutable_grad() = grads.at(p.name).clone();
}

// Three steps of Muon (hidden matrices) + AdamW (the rest) equal the NumPy
// reference after every step: fp64 to 1e-10, fp32 to 1e-5 (relative).
TEST(TrainOptimizer, MuonAndAdamWStepsMatchTheReference) {
  for (const auto& r : golden().at("runs")) {
    for (const auto dt : {at::kDouble, at::kFloat}) {
      SCOPED_TRACE(r.at("options").at("name").get<std::string>() + (dt == at::kDouble ? " fp64" : " fp32"));
      GoldenRun g = golden_run(r, dt);
      Optimizer opt(g.params, g.opts);
      EXPECT_EQ(opt.muon_names(), (std::vector<std::string>{"attn.weight", "ffn.weight"}));
      for (size_t s = 0; s < g.grads.size(); ++s) {
        opt.zero_grad();
        set_grads(g.params, g.grads[s]);
        opt.step(g.lrs[s].first, g.lrs[s].second);
        for (const auto& p : g.params) {
          const at::Tensor& want = g.after[s].at(p.name);
          const at::Tensor start = tensor_of(r.at("params").at(p.name));
          // The step moved it, and to where the reference did.
          EXPECT_GT((want - start).abs().max().item<double>(), 1e-4) << p.name;
          EXPECT_LT(max_rel(p.tensor.detach(), want), dt == at::kDouble ? 1e-10 : 1e-5)
              << p.name << " after step " << s + 1;
        }
      }
    }
  }
}

// With kind AdamW every parameter is AdamW's, whatever `muon` says.
TEST(TrainOptimizer, AdamWKindIgnoresTheMuonFlag) {
  at::Tensor a = at::ones({3, 4}, at::kDouble).requires_grad_(true);
  Optimizer opt({{"w", a, true}}, OptimizerOptions{});
  EXPECT_TRUE(opt.muon_names().empty());
  a.mutable_grad() = at::full({3, 4}, 0.5, at::kDouble);
  opt.step(0.1, 99.0);
  // AdamW's first step moves every entry by lr (sign of the gradient).
  EXPECT_NEAR(a.detach()[0][0].item<double>(), 0.9, 1e-6);
}

TEST(TrainOptimizer, DrafterMatricesMuonTakes) {
  DrafterConfig c;
  c.n_layers = 2;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 16;
  c.ffn = 64;
  c.hidden = 32;
  c.vocab = 64;
  c.tap_layers = {0, 1};
  c.seq_head = SeqHead::Gated;
  c.target_id = "t";
  std::vector<std::string> muon;
  for (const auto& [name, shape] : Drafter::param_spec(c))
    if (is_muon_param(name, shape)) muon.push_back(name);
  const std::vector<std::string> want = {
      "fc.weight",
      "layers.0.attn_q.weight", "layers.0.attn_k.weight", "layers.0.attn_v.weight", "layers.0.attn_output.weight",
      "layers.0.ffn_gate.weight", "layers.0.ffn_up.weight", "layers.0.ffn_down.weight",
      "layers.1.attn_q.weight", "layers.1.attn_k.weight", "layers.1.attn_v.weight", "layers.1.attn_output.weight",
      "layers.1.ffn_gate.weight", "layers.1.ffn_up.weight", "layers.1.ffn_down.weight",
      "markov_gate.weight"};
  EXPECT_EQ(muon, want);
}

// save → load into a fresh optimizer → the next steps equal the uninterrupted
// ones bit for bit; an AdamW state does not load into a Muon optimizer.
TEST(TrainOptimizer, StateRoundTripsAndIsChecked) {
  const json& r = golden().at("runs")[0];
  GoldenRun a = golden_run(r, at::kDouble), b = golden_run(r, at::kDouble);
  Optimizer oa(a.params, a.opts);
  auto run_step = [&](Optimizer& o, GoldenRun& g, size_t s) {
    o.zero_grad();
    set_grads(g.params, g.grads[s]);
    o.step(g.lrs[s].first, g.lrs[s].second);
  };
  for (size_t s = 0; s < 3; ++s) run_step(oa, a, s);

  std::string bytes;
  {
    Optimizer ob(b.params, b.opts);
    run_step(ob, b, 0);
    torch::serialize::OutputArchive ar;
    ob.save(ar);
    std::ostringstream os;
    ar.save_to(os);
    bytes = os.str();
  }
  Optimizer oc(b.params, b.opts);
  torch::serialize::InputArchive in;
  in.load_from(bytes.data(), bytes.size());
  oc.load(in);
  for (size_t s = 1; s < 3; ++s) run_step(oc, b, s);
  for (size_t i = 0; i < a.params.size(); ++i)
    EXPECT_TRUE(at::equal(a.params[i].tensor, b.params[i].tensor)) << a.params[i].name;

  // A state written by AdamW into a Muon optimizer: refused, saying both.
  OptimizerOptions adam = b.opts;
  adam.kind = OptimizerKind::AdamW;
  Optimizer od(golden_run(r, at::kDouble).params, adam);
  torch::serialize::OutputArchive ar;
  od.save(ar);
  std::ostringstream os;
  ar.save_to(os);
  const std::string abytes = os.str();
  torch::serialize::InputArchive in2;
  in2.load_from(abytes.data(), abytes.size());
  EXPECT_MENTIONS(test::message_of<FormatError>([&] { oc.load(in2); }), "written by adamw, this run uses muon");
}

}  // namespace
