// One generation as a step-wise state machine; see include/dspark/spec/session.hpp.
#include "dspark/spec/session.hpp"

#include <algorithm>
#include <chrono>

#include "dspark/error.hpp"

namespace dspark {

namespace {
using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

struct SpecSession::Impl {
  TargetModel& target;
  const DraftModel* drafter;
  std::vector<TokenId> prompt;
  GenerateOptions opts;
  SpecOptions spec;
  int gamma = 0;
  KVCache cache;
  Rng rng;
  TapRequest taps;
  DraftState ds;
  GenerateResult res;

  int64_t n_prefilled = 0;  // prompt tokens in the cache
  int64_t chunk = 0;        // prompt tokens of the next prefill call (0: all)
  int64_t chunk_sent = 0;   // prompt tokens of the call in flight
  bool prefilled = false;
  bool done = false;
  TokenId anchor = -1;
  int64_t anchor_pos = 0;  // absolute position of the anchor
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
      res.stop_token = t;
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

  // The token of absolute position `pos` from target logits [V].
  TokenId target_token(const float* logits, int64_t V, int64_t pos) {
    return pick_token(logits, V, opts.sampling, rng, pos);
  }

  // Sampled verification of the current round; returns the accepted count
  // and sets `next` to the correction or bonus token.
  int verify_sampled(const float* logits, int64_t V, TokenId& next) {
    const SamplingParams& sp = opts.sampling;
    if (sp.rule == SamplingRule::SeedStable) {
      // Accept while the draft equals the target's own token of that
      // position: the output is the plain-sampled sequence.
      for (int k = 0; k <= ell; ++k) {
        next = target_token(logits + k * V, V, anchor_pos + 1 + k);
        if (k == ell || next != dr.tokens[k]) return k;
      }
    }
    for (int k = 0; k < ell; ++k) {
      Distribution p = process_logits(logits + k * V, V, sp);
      if (!accept_token(p, dr.q[k], dr.tokens[k], rng.uniform())) {
        next = sample(residual(p, dr.q[k]), rng);
        return k;
      }
    }
    next = sample(process_logits(logits + ell * V, V, sp), rng);
    return ell;
  }
};

SpecSession::SpecSession(TargetModel& target, const DraftModel* drafter, std::vector<TokenId> prompt,
                         GenerateOptions opts, SpecOptions spec)
    : impl_(std::make_unique<Impl>(target, drafter, std::move(prompt), std::move(opts), std::move(spec))) {}
SpecSession::~SpecSession() = default;
SpecSession::SpecSession(SpecSession&&) noexcept = default;
SpecSession& SpecSession::operator=(SpecSession&&) noexcept = default;

bool SpecSession::finished() const { return impl_->done; }
bool SpecSession::prefilling() const { return !impl_->prefilled; }
int64_t SpecSession::prefilled_tokens() const { return impl_->n_prefilled; }
int64_t SpecSession::prefill_remaining() const {
  return static_cast<int64_t>(impl_->prompt.size()) - impl_->n_prefilled;
}
void SpecSession::set_prefill_chunk(int64_t n) { impl_->chunk = std::clamp<int64_t>(n, 1, std::max<int64_t>(prefill_remaining(), 1)); }
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
  s.ell = static_cast<int>(s.dr.tokens.size());
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
    if (s.n_prefilled == 0) s.t_start = s.t_call;
    const int64_t left = prefill_remaining();
    s.chunk_sent = s.chunk > 0 ? std::min(s.chunk, left) : left;
    s.chunk = 0;
    const std::span<const TokenId> part(s.prompt.data() + s.n_prefilled, static_cast<size_t>(s.chunk_sent));
    return ForwardSeq{&s.cache, part, s.chunk_sent == left ? Logits::Last : Logits::None};
  }
  s.anchor_pos = s.cache.size();
  s.block.assign(1, s.anchor);
  s.block.insert(s.block.end(), s.dr.tokens.begin(), s.dr.tokens.begin() + s.ell);
  return ForwardSeq{&s.cache, s.block, Logits::All};
}

void SpecSession::consume(const ForwardOut& out) {
  Impl& s = *impl_;
  auto& st = s.res.stats;
  const int64_t V = s.target.info().vocab;
  if (!s.prefilled) {
    if (s.drafter) s.drafter->append_context(s.ds, out.taps);
    s.n_prefilled += s.chunk_sent;
    if (s.n_prefilled < static_cast<int64_t>(s.prompt.size())) return;  // more chunks to come
    s.anchor = s.target_token(out.logits.data_ptr<float>(), V, s.n_prefilled);
    s.prefilled = true;
    s.t_prefilled = Clock::now();
    st.prefill_s = seconds(s.t_start, s.t_prefilled);
    if (s.emit(s.anchor)) s.after_anchor();
    return;
  }
  const float* logits = out.logits.data_ptr<float>();
  st.verify_s += seconds(s.t_call, Clock::now());
  ++st.target_calls;
  const int ell = s.ell;
  int n_acc = 0;
  TokenId next = -1;
  if (s.opts.sampling.greedy()) {
    while (n_acc < ell && s.dr.tokens[n_acc] == argmax(logits + n_acc * V, V)) ++n_acc;
    next = argmax(logits + n_acc * V, V);
  } else {
    n_acc = s.verify_sampled(logits, V, next);
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

}  // namespace dspark
