// One generation as a step-wise state machine; see include/dspark/spec/session.hpp.
#include "dspark/spec/session.hpp"

#include <algorithm>
#include <chrono>

#include "dspark/error.hpp"
#include "dspark/spec/calibration.hpp"
#include "dspark/spec/scheduler.hpp"

namespace dspark {

namespace {
using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::vector<double> resolve_thresholds(const DraftModel& d, const SpecOptions& s, int gamma) {
  if (!s.prune) return {};
  if (s.min_conf >= 0) return std::vector<double>(static_cast<size_t>(gamma), s.min_conf);
  if (s.thresholds) return *s.thresholds;
  return d.calibrated_thresholds();
}

// Checkpoint thresholds are on calibrated survival when the checkpoint holds
// STS temperatures; explicit thresholds stay on per-position confidence.
std::vector<double> resolve_prune_temperatures(const DraftModel& d, const SpecOptions& s) {
  if (!s.prune || s.min_conf >= 0 || s.thresholds) return {};
  return d.calibrated_temperatures();
}
}  // namespace

struct SpecSession::Impl {
  TargetModel& target;
  const DraftModel* drafter;
  std::vector<TokenId> prompt;
  GenerateOptions opts;
  SpecOptions spec;
  int gamma = 0;
  std::vector<double> thresholds;
  std::vector<double> prune_temperatures;  // empty: thresholds apply to σ(z_k)
  KVCache cache;
  Rng rng;
  TapRequest taps;
  DraftState ds;
  GenerateResult res;

  bool prefilled = false;
  bool done = false;
  TokenId anchor = -1;
  Draft dr;            // current round's draft
  int ell = 0;         // verify length for the current round
  std::vector<TokenId> block;
  Clock::time_point t_start, t_prefilled, t_call;

  Impl(TargetModel& t, const DraftModel* d, std::vector<TokenId> p, GenerateOptions o, SpecOptions s)
      : target(t), drafter(d), prompt(std::move(p)), opts(std::move(o)), spec(std::move(s)),
        cache(t.new_cache(opts.ctx_size)), rng(opts.sampling.seed) {
    opts.sampling.validate();
    check_prompt_fits(static_cast<int64_t>(prompt.size()), cache.max_tokens());
    if (drafter) {
      drafter->check_target(t.info());
      gamma = spec.gamma > 0 ? spec.gamma : drafter->gamma();
      if (gamma < 1 || gamma > kMaxGamma)
        throw InvalidArgument("gamma must be in [1, " + std::to_string(kMaxGamma) + "], got " +
                              std::to_string(gamma));
      if (spec.thresholds && spec.thresholds->size() > static_cast<size_t>(gamma))
        throw InvalidArgument("thresholds: expected at most gamma = " + std::to_string(gamma) +
                              " values (one per draft position), got " +
                              std::to_string(spec.thresholds->size()));
      thresholds = resolve_thresholds(*drafter, spec, gamma);
      prune_temperatures = resolve_prune_temperatures(*drafter, spec);
      taps.layers = drafter->tap_layers();
      res.stats.reached_by_position.assign(static_cast<size_t>(gamma), 0);
      res.stats.accepted_by_position.assign(static_cast<size_t>(gamma), 0);
    }
    res.stats.prompt_tokens = static_cast<int64_t>(prompt.size());
  }

  bool is_stop(TokenId t) const {
    return std::find(opts.stop_ids.begin(), opts.stop_ids.end(), t) != opts.stop_ids.end();
  }

  // Emits one token; returns false (and finishes) when generation must end.
  bool emit(TokenId t) {
    if (is_stop(t)) {
      res.stopped_by_eog = true;
      return finish();
    }
    res.tokens.push_back(t);
    if (opts.on_token && !opts.on_token(t)) return finish();
    if (static_cast<int64_t>(res.tokens.size()) >= opts.n_predict) return finish();
    return true;
  }

  bool finish() {
    if (!done) {
      done = true;
      res.stats.generated_tokens = static_cast<int64_t>(res.tokens.size());
      res.stats.decode_s = prefilled ? seconds(t_prefilled, Clock::now()) : 0.0;
    }
    return false;
  }

  // After emitting an anchor: a round needs room for it in the cache.
  void after_anchor() {
    if (!done && cache.size() + 1 > cache.max_tokens()) finish();
  }
};

SpecSession::SpecSession(TargetModel& target, const DraftModel* drafter, std::vector<TokenId> prompt,
                         GenerateOptions opts, SpecOptions spec)
    : impl_(std::make_unique<Impl>(target, drafter, std::move(prompt), std::move(opts), std::move(spec))) {}
SpecSession::~SpecSession() = default;
SpecSession::SpecSession(SpecSession&&) noexcept = default;
SpecSession& SpecSession::operator=(SpecSession&&) noexcept = default;

bool SpecSession::finished() const { return impl_->done; }
const std::vector<float>& SpecSession::conf_logits() const { return impl_->dr.conf_logits; }
int SpecSession::max_verify() const { return impl_->ell; }
const TapRequest& SpecSession::taps() const { return impl_->taps; }
GenerateResult& SpecSession::result() { return impl_->res; }
const GenerateResult& SpecSession::result() const { return impl_->res; }
void SpecSession::cancel() { impl_->finish(); }

void SpecSession::set_verify_length(int ell) { impl_->ell = std::clamp(ell, 0, impl_->ell); }

void SpecSession::draft() {
  Impl& s = *impl_;
  s.dr = Draft{};
  s.ell = 0;
  if (s.done || !s.prefilled || !s.drafter) return;
  const int64_t room = s.cache.max_tokens() - s.cache.size() - 1;
  const int64_t budget = s.opts.n_predict - static_cast<int64_t>(s.res.tokens.size());
  const int g = static_cast<int>(std::min<int64_t>({s.gamma, room, budget}));
  if (g <= 0) return;
  const auto t0 = Clock::now();
  s.dr = s.drafter->draft(s.ds, s.anchor, g, s.opts.sampling, s.rng);
  s.res.stats.draft_s += seconds(t0, Clock::now());
  s.ell = prune_length(s.dr.conf_logits, s.thresholds, s.prune_temperatures);
  if (!s.spec.sps.empty()) {
    const auto a = calibrated_survival(s.dr.conf_logits, s.drafter->calibrated_temperatures());
    s.ell = std::min(s.ell, schedule_single(std::vector<double>(a.begin(), a.begin() + s.ell), s.spec.sps));
  }
}

void SpecSession::skip_draft() {
  Impl& s = *impl_;
  s.dr = Draft{};
  s.ell = 0;
}

ForwardSeq SpecSession::forward_input() {
  Impl& s = *impl_;
  if (s.done) throw InvalidArgument("forward_input: the session has finished");
  s.t_call = Clock::now();
  if (!s.prefilled) {
    s.t_start = s.t_call;
    return ForwardSeq{&s.cache, s.prompt, Logits::Last};
  }
  s.block.assign(1, s.anchor);
  s.block.insert(s.block.end(), s.dr.tokens.begin(), s.dr.tokens.begin() + s.ell);
  return ForwardSeq{&s.cache, s.block, Logits::All};
}

void SpecSession::consume(const ForwardOut& out) {
  Impl& s = *impl_;
  auto& st = s.res.stats;
  const int64_t V = s.target.info().vocab;
  const float* logits = out.logits.data_ptr<float>();
  if (!s.prefilled) {
    if (s.drafter) s.drafter->append_context(s.ds, out.taps);
    s.anchor = pick_token(logits, V, s.opts.sampling, s.rng);
    s.prefilled = true;
    s.t_prefilled = Clock::now();
    st.prefill_s = seconds(s.t_start, s.t_prefilled);
    if (s.emit(s.anchor)) s.after_anchor();
    return;
  }
  st.verify_s += seconds(s.t_call, Clock::now());
  ++st.target_calls;
  const int ell = s.ell;
  int n_acc = 0;
  TokenId next = -1;
  if (s.opts.sampling.greedy()) {
    while (n_acc < ell && s.dr.tokens[n_acc] == argmax(logits + n_acc * V, V)) ++n_acc;
    next = argmax(logits + n_acc * V, V);
  } else {
    for (; n_acc < ell; ++n_acc) {
      Distribution p = process_logits(logits + n_acc * V, V, s.opts.sampling);
      if (!accept_token(p, s.dr.q[n_acc], s.dr.tokens[n_acc], s.rng.uniform())) {
        next = sample(residual(p, s.dr.q[n_acc]), s.rng);
        break;
      }
    }
    if (n_acc == ell) next = sample(process_logits(logits + ell * V, V, s.opts.sampling), s.rng);
  }
  if (s.drafter) {
    ++st.rounds;
    st.drafted += ell;
    st.accepted += n_acc;
    for (int k = 0; k < ell && k <= n_acc; ++k) {
      ++st.reached_by_position[k];
      if (k < n_acc) ++st.accepted_by_position[k];
    }
    if (s.spec.on_round)
      for (int k = 0; k < ell; ++k) s.spec.on_round(k, s.dr.conf_logits[k], k < n_acc);
    // Roll back the rejected tail; the anchor and accepted drafts extend the
    // drafter's context.
    s.cache.trim(ell - n_acc);
    s.drafter->append_context(s.ds, out.taps.narrow(0, 0, n_acc + 1));
  }
  for (int k = 0; k < n_acc; ++k)
    if (!s.emit(s.dr.tokens[k])) return;
  s.anchor = next;
  if (s.emit(next)) s.after_anchor();
}

// ---- single-request drivers -------------------------------------------------

namespace {
GenerateResult run_session(TargetModel& target, SpecSession& s) {
  while (!s.finished()) {
    s.draft();
    ForwardSeq f = s.forward_input();
    auto out = target.forward(std::span<ForwardSeq>(&f, 1), s.taps());
    s.consume(out[0]);
  }
  return std::move(s.result());
}
}  // namespace

GenerateResult generate_plain(TargetModel& model, const std::vector<TokenId>& prompt,
                              const GenerateOptions& opts) {
  SpecSession s(model, nullptr, prompt, opts);
  return run_session(model, s);
}

GenerateResult generate_speculative(TargetModel& target, const DraftModel& drafter,
                                    const std::vector<TokenId>& prompt, const GenerateOptions& opts,
                                    const SpecOptions& spec) {
  SpecSession s(target, &drafter, prompt, opts, spec);
  return run_session(target, s);
}

}  // namespace dspark
