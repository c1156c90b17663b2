// Shared pieces of the speculative-decoding, drafter and checkpoint tests:
// the real model (loaded once per test binary), the dev prompts, cached plain
// reference runs, seeded random drafters of every head type, oracle drafters
// that know the target's own continuation, and a drafter wrapper that records
// every drafting pass.
//
// Header-only (the test binary is built from tests/*_test.cpp alone).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/model/loaded_model.hpp"
#include "dspark/speculative/drafter.hpp"
#include "dspark/speculative/generate.hpp"
#include "dspark/speculative/sampling.hpp"
#include "dspark/speculative/speculative.hpp"
#include "test_util.hpp"

namespace dspark::spectest {

using test::full_mode;

/// True in a per-kernel-level run (CMakeLists.txt's kernel_level.* tests set
/// DSPARK_LEVEL_RUN): the whole suite again on a lower, often scalar, level.
inline bool level_run() {
  const char* v = std::getenv("DSPARK_LEVEL_RUN");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

inline const std::vector<SeqHead>& all_heads() {
  static const std::vector<SeqHead> h = {SeqHead::None, SeqHead::Markov, SeqHead::Gated,
                                         SeqHead::Rnn, SeqHead::Elman};
  return h;
}

// ---- the real model ---------------------------------------------------------------

/// SmolLM2 with tokenizer and chat template, loaded on first use and shared by
/// every test of the binary; nullptr when the file is missing.
inline LoadedModel* real_model() {
  static std::unique_ptr<LoadedModel> m = []() -> std::unique_ptr<LoadedModel> {
    if (!test::model_available()) return nullptr;
    return std::make_unique<LoadedModel>(LoadedModel::load(test::model_path()));
  }();
  return m.get();
}

/// Binds `var` (LoadedModel&) to the real model; fails the test when missing.
#define DSPARK_REAL_MODEL(var)                                                   \
  ::dspark::LoadedModel* var##_ptr_ = ::dspark::spectest::real_model();          \
  if (var##_ptr_ == nullptr) FAIL() << ::dspark::test::missing_model_message(); \
  ::dspark::LoadedModel& var = *var##_ptr_

/// The 40 dev prompts (texts), in file order.
inline const std::vector<std::string>& dev_prompts() {
  static const std::vector<std::string> p = [] {
    const std::string path = DSPARK_SOURCE_DIR "/data/dev-prompts.jsonl";
    std::ifstream f(path);
    if (!f) throw std::runtime_error("cannot read " + path);
    std::vector<std::string> out;
    std::string line;
    while (std::getline(f, line)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      out.push_back(nlohmann::json::parse(line).at("prompt").get<std::string>());
    }
    return out;
  }();
  return p;
}

/// Chat-encoded ids of dev prompt `i` (cached).
inline const std::vector<TokenId>& dev_prompt_ids(size_t i) {
  static std::map<size_t, std::vector<TokenId>> cache;
  auto it = cache.find(i);
  if (it == cache.end())
    it = cache.emplace(i, real_model()->encode_prompt(dev_prompts().at(i), true)).first;
  return it->second;
}

/// `n` prompt indices spread evenly over the dev set.
inline std::vector<size_t> spread_prompts(size_t n) {
  const size_t total = dev_prompts().size();
  std::vector<size_t> idx;
  for (size_t i = 0; i < n && i < total; ++i) idx.push_back(i * total / n);
  return idx;
}

inline GenerateOptions greedy_options(int64_t n_predict, std::vector<TokenId> stop_ids) {
  GenerateOptions o;
  o.n_predict = n_predict;
  o.sampling.temperature = 0.f;
  o.stop_ids = std::move(stop_ids);
  return o;
}

/// Plain greedy decoding of dev prompt `i` (cached per prompt, length and stop
/// set).
inline const GenerateResult& plain_greedy(size_t i, int64_t n_predict,
                                          const std::vector<TokenId>& stop_ids) {
  using Key = std::tuple<size_t, int64_t, std::vector<TokenId>>;
  static std::map<Key, GenerateResult> cache;
  Key key{i, n_predict, stop_ids};
  auto it = cache.find(key);
  if (it == cache.end()) {
    it = cache.emplace(key, generate_plain(*real_model()->target, dev_prompt_ids(i),
                                           greedy_options(n_predict, stop_ids)))
             .first;
  }
  return it->second;
}

/// The target's own greedy continuation of dev prompt `i`, ignoring every
/// stop id, `n` tokens long: what an oracle drafter proposes. (Greedy output
/// without stop ids only grows with n, so one run of at least 64 tokens per
/// prompt serves every shorter request.)
inline std::vector<TokenId> reference_continuation(size_t i, int64_t n) {
  const auto& run = plain_greedy(i, std::max<int64_t>(n, 64), {}).tokens;
  return std::vector<TokenId>(run.begin(), run.begin() + std::min<int64_t>(n, static_cast<int64_t>(run.size())));
}

/// A tiny random Llama target (tests/test_util.hpp, seed 7), shared by the
/// tests that need a target but not the real model's weights.
inline TargetModel& tiny_target() {
  static test::TempDir dir;
  static std::unique_ptr<TargetModel> t = [] {
    const std::string path = dir.file("tiny-llama.gguf");
    test::write_tiny_llama(path, 7);
    return load_target(path);
  }();
  return *t;
}

// ---- random drafters --------------------------------------------------------------

/// A one-layer drafter configuration for `target` with sequential head `head`.
inline DrafterConfig small_config(const TargetInfo& target, SeqHead head, int gamma = 12) {
  DrafterConfig c;
  c.gamma = gamma;
  c.n_layers = 1;
  c.markov_rank = 32;
  c.seq_head = head;
  c.complete_from(target);
  return c;
}

/// Drafter::init(seed), then perturbed so that every part matters: the
/// zero-initialized sequential-head outputs (W2, elman.wo) and the Markov
/// embedding get unit-scale values (so each head changes the drafted tokens),
/// and the confidence projection is widened so confidences spread over (0, 1)
/// and pruning at min_conf 0.5 cuts blocks often. Not bound.
inline Drafter perturbed_drafter(const DrafterConfig& cfg, uint64_t seed) {
  Drafter d = Drafter::init(cfg, seed);
  at::Generator gen = at::detail::createCPUGenerator(seed ^ 0x5EEDull);
  auto& p = d.mutable_params();
  auto fill = [&](const std::string& name, double stddev) {
    auto it = p.find(name);
    if (it != p.end()) it->second.normal_(0.0, stddev, gen);
  };
  fill("markov_w1.weight", 1.0);
  fill("markov_w2.weight", 1.0);
  fill("elman.wo", 1.0);
  fill("conf_proj.weight", 0.2);
  return d;
}

/// Both drafters, bound to `target` (a vocabulary of at least 262 tokens), give
/// the same block hidden states, greedy drafts and confidence logits after
/// the same context, at several anchors.
inline void expect_same_drafts(Drafter a, Drafter b, const TargetModel& target) {
  a.bind(target);
  b.bind(target);
  std::vector<TokenId> ids;
  for (int i = 0; i < 20; ++i) ids.push_back(static_cast<TokenId>((i * 37 + 11) % 262));
  KVCache cache = target.new_cache();
  const at::Tensor feats =
      const_cast<TargetModel&>(target).forward_one(cache, ids, Logits::None, TapRequest{a.tap_layers(), false}).taps;
  DraftState sa, sb;
  a.append_context(sa, feats);
  b.append_context(sb, feats);
  SamplingParams greedy;
  greedy.temperature = 0.f;
  Rng rng(1);
  for (TokenId anchor : {3, 100, 261}) {
    EXPECT_TRUE(at::equal(a.block_hidden(sa, anchor, a.gamma()), b.block_hidden(sb, anchor, b.gamma())))
        << "anchor " << anchor;
    const Draft da = a.draft(sa, anchor, 0, greedy, rng), db = b.draft(sb, anchor, 0, greedy, rng);
    EXPECT_EQ(da.tokens, db.tokens) << "anchor " << anchor;
    EXPECT_EQ(da.conf_logits, db.conf_logits) << "anchor " << anchor;
  }
}

/// perturbed_drafter bound to `target`.
inline Drafter random_drafter(const TargetModel& target, SeqHead head, uint64_t seed = 1234) {
  Drafter d = perturbed_drafter(small_config(target.info(), head), seed);
  d.bind(target);
  return d;
}

// ---- oracle drafters --------------------------------------------------------------

inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Deterministic uniform in [0, 1) from a seed and two coordinates.
inline double hash_uniform(uint64_t seed, int64_t a, int64_t b) {
  const uint64_t h = mix64(mix64(mix64(seed) ^ static_cast<uint64_t>(a)) ^ static_cast<uint64_t>(b));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

/// A DraftModel that knows the target's own continuation. The anchor at
/// context position pos is generated token i = pos - prompt_len; slot k
/// proposes reference[i + 1 + k]:
///   perfect  — always the reference token;
///   wrong    — never the reference token;
///   noisy    — the reference token, replaced by a wrong one with probability
///              `noise` (decided by a hash of seed, position and slot, so a
///              run is deterministic and independent of the sampling RNG);
///   cycle    — pass c (0-based) gets exactly slot c mod (gamma + 1) wrong
///              (none when that is gamma), so successive full rounds accept
///              prefixes of every length 0..gamma in turn.
/// Confidence logits are hash-derived in [conf_lo, conf_hi).
///
/// In sampling mode each proposal is drawn from a per-slot q built from
/// `candidates[j]` (ids likely under the target at generated index j; the
/// first is the reference token), by slot hash: one-hot on the reference
/// token, peaked on the second candidate, or half on the reference token and
/// half on a token outside the candidates. Without candidates q is one-hot on
/// the greedy proposal.
class OracleDrafter : public DraftModel {
 public:
  enum class Kind { Perfect, Noisy, Wrong, Cycle };

  OracleDrafter(Kind kind, std::vector<TokenId> reference, int64_t prompt_len, int64_t vocab,
                double noise = 0.3, uint64_t seed = 1)
      : kind_(kind), ref_(std::move(reference)), prompt_len_(prompt_len), vocab_(vocab),
        noise_(noise), seed_(seed) {}

  void set_gamma(int g) { gamma_ = g; }
  void set_conf_range(double lo, double hi) { conf_lo_ = lo, conf_hi_ = hi; }
  void set_thresholds(std::vector<double> t) { thresholds_ = std::move(t); }
  void set_candidates(std::vector<std::vector<TokenId>> c) { cands_ = std::move(c); }

  int gamma() const override { return gamma_; }
  const std::vector<int>& tap_layers() const override { return taps_; }
  void check_target(const TargetInfo& target) const override {
    if (target.vocab != vocab_) throw InvalidArgument("oracle drafter: vocabulary mismatch");
  }
  std::vector<double> calibrated_thresholds() const override { return thresholds_; }
  void append_context(DraftState& st, const at::Tensor& feats) const override {
    st.n_ctx += feats.size(0);
  }

  Draft draft(const DraftState& st, TokenId anchor, int gamma, const SamplingParams& sampling,
              Rng& rng) const override {
    const int64_t i = st.n_ctx - prompt_len_;  // index of the anchor among generated tokens
    if (i >= 0 && i < static_cast<int64_t>(ref_.size()) && ref_[static_cast<size_t>(i)] != anchor)
      ++anchor_mismatches;
    ++calls;
    Draft d;
    for (int k = 0; k < gamma; ++k) {
      const int64_t j = i + 1 + k;  // generated index this slot predicts
      const TokenId truth = j >= 0 && j < static_cast<int64_t>(ref_.size())
                                ? ref_[static_cast<size_t>(j)]
                                : static_cast<TokenId>(j % vocab_);
      bool corrupt = kind_ == Kind::Wrong;
      if (kind_ == Kind::Noisy) corrupt = hash_uniform(seed_, st.n_ctx, k) < noise_;
      if (kind_ == Kind::Cycle) corrupt = k == (calls - 1) % (gamma + 1);
      TokenId x = corrupt ? wrong_token(truth, st.n_ctx, k) : truth;
      d.conf_logits.push_back(static_cast<float>(
          conf_lo_ + (conf_hi_ - conf_lo_) * hash_uniform(seed_ ^ 0xC0F, st.n_ctx, k)));
      if (!sampling.greedy()) {
        d.q.push_back(proposal(x, j, st.n_ctx, k));
        x = draw(d.q.back(), sampling, rng, st.n_ctx + 1 + k);
      }
      d.tokens.push_back(x);
    }
    return d;
  }

  mutable int64_t anchor_mismatches = 0;  // anchors that differ from the reference
  mutable int64_t calls = 0;

 private:
  TokenId wrong_token(TokenId truth, int64_t pos, int k) const {
    const int64_t off = 1 + static_cast<int64_t>(hash_uniform(seed_ ^ 0xBAD, pos, k) * 97.0);
    return static_cast<TokenId>((truth + off) % vocab_);
  }

  static Distribution make(std::vector<std::pair<TokenId, float>> items) {
    std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
      return a.second > b.second || (a.second == b.second && a.first < b.first);
    });
    Distribution d;
    for (const auto& [id, p] : items) {
      d.ids.push_back(id);
      d.probs.push_back(p);
    }
    return d;
  }

  Distribution proposal(TokenId greedy_pick, int64_t j, int64_t pos, int k) const {
    if (j < 0 || j >= static_cast<int64_t>(cands_.size()) || cands_[static_cast<size_t>(j)].size() < 4)
      return make({{greedy_pick, 1.f}});
    const auto& c = cands_[static_cast<size_t>(j)];
    const double u = hash_uniform(seed_ ^ 0x9, pos, k);
    if (u < 1.0 / 3.0) return make({{greedy_pick, 1.f}});
    if (u < 2.0 / 3.0) return make({{c[1], 0.7f}, {c[0], 0.1f}, {c[2], 0.1f}, {c[3], 0.1f}});
    TokenId outside = static_cast<TokenId>((c[0] + 7919) % vocab_);
    while (outside == greedy_pick || std::find(c.begin(), c.end(), outside) != c.end())
      outside = static_cast<TokenId>((outside + 1) % vocab_);
    return make({{greedy_pick, 0.5f}, {outside, 0.5f}});
  }

  Kind kind_;
  std::vector<TokenId> ref_;
  int64_t prompt_len_, vocab_;
  double noise_;
  uint64_t seed_;
  int gamma_ = 7;
  double conf_lo_ = 2.0, conf_hi_ = 4.0;
  std::vector<double> thresholds_;
  std::vector<std::vector<TokenId>> cands_;
  std::vector<int> taps_{0};
};

/// Forwards to another DraftModel and records every drafting pass: how many
/// passes ran and how many of them confidence pruning (with `thresholds`)
/// cut short.
class RecordingDrafter : public DraftModel {
 public:
  RecordingDrafter(const DraftModel& inner, std::vector<double> thresholds)
      : inner_(inner), thresholds_(std::move(thresholds)) {}
  int gamma() const override { return inner_.gamma(); }
  const std::vector<int>& tap_layers() const override { return inner_.tap_layers(); }
  void check_target(const TargetInfo& t) const override { inner_.check_target(t); }
  std::vector<double> calibrated_thresholds() const override { return inner_.calibrated_thresholds(); }
  void append_context(DraftState& st, const at::Tensor& feats) const override {
    inner_.append_context(st, feats);
  }
  Draft draft(const DraftState& st, TokenId anchor, int gamma, const SamplingParams& sampling,
              Rng& rng) const override {
    Draft d = inner_.draft(st, anchor, gamma, sampling, rng);
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    ++passes;
    const int keep = prune_length(d.conf_logits, thresholds_);
    if (keep < static_cast<int>(d.tokens.size())) ++pruned;
    kept += keep;
    return d;
  }
  mutable int64_t passes = 0;
  mutable int64_t pruned = 0;  // passes cut short by pruning
  std::chrono::milliseconds delay{0};  // added to every pass: a drafter that costs this much
  mutable int64_t kept = 0;    // draft positions left for verification

 private:
  const DraftModel& inner_;
  std::vector<double> thresholds_;
};

// ---- comparison ---------------------------------------------------------------------

inline std::string ids_str(const std::vector<TokenId>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? " " : "") << v[i];
  os << "]";
  return os.str();
}

/// Index of the first differing token, or -1 when equal.
inline int64_t first_difference(const std::vector<TokenId>& a, const std::vector<TokenId>& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  return a.size() == b.size() ? -1 : static_cast<int64_t>(n);
}

/// Describes how `spec` differs from `plain` (empty when they agree on
/// tokens, stopped_by_eog and generated_tokens).
inline std::string compare_runs(const GenerateResult& plain, const GenerateResult& spec) {
  std::ostringstream os;
  const int64_t d = first_difference(plain.tokens, spec.tokens);
  if (d >= 0)
    os << "tokens differ at " << d << ": plain " << ids_str(plain.tokens) << " spec "
       << ids_str(spec.tokens) << "; ";
  if (plain.stopped_by_eog != spec.stopped_by_eog)
    os << "stopped_by_eog plain " << plain.stopped_by_eog << " spec " << spec.stopped_by_eog << "; ";
  if (plain.stats.generated_tokens != spec.stats.generated_tokens)
    os << "generated_tokens plain " << plain.stats.generated_tokens << " spec "
       << spec.stats.generated_tokens << "; ";
  return os.str();
}

}  // namespace dspark::spectest
