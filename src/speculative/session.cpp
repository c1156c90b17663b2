// One generation as a step-wise state machine; see include/dspark/speculative/session.hpp.
#include "dspark/speculative/session.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "dspark/error.hpp"
#include "dspark/speculative/calibration.hpp"
#include "dspark/speculative/drafter_gate.hpp"
#include "dspark/speculative/scheduler.hpp"

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
  int gamma = 0;         // the drafter's block size
  int lookup_gamma = 0;  // the longest lookup draft (0: lookup off)
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
  bool dr_lookup = false;  // dr came from prompt lookup
  int ell = 0;         // verify length for the current round
  std::vector<TokenId> history;  // prompt ++ emitted tokens (lookup drafts)
  std::vector<int64_t> lookup_reached, lookup_accepted;  // per position, lookup rounds
  int64_t lookup_reached_all = 0, lookup_accepted_all = 0;  // their sums
  std::vector<double> dr_acceptance;  // a lookup draft's estimated acceptance per position
  DrafterGate gate;    // whether a round runs the drafter (its rounds so far, the SPS curve)
  // Drafting seconds of the current round as the drafter-skip rule prices
  // it: a round after skipped ones takes in their context too, and only the
  // share a drafter running every round would take in (the last round's
  // rows) is charged, or one exploration round after many skipped would
  // look many times its cost and keep the drafter off.
  double dr_s = 0;
  // Target features of emitted tokens the drafter has not yet taken in
  // (append_context): rounds that do not draft leave them here, and the
  // next drafting round takes them all in one call (the same drafter state:
  // the drafter's kernels give every row the same bits in any batch).
  std::vector<at::Tensor> pending_taps;
  int64_t pending_rows = 0;
  int64_t last_rows = 0;  // rows of the last deferred round
  std::vector<TokenId> block;
  Clock::time_point t_start, t_prefilled, t_call;

  Impl(TargetModel& t, const DraftModel* d, std::vector<TokenId> p, GenerateOptions o, SpecOptions s)
      : target(t), drafter(d), prompt(std::move(p)), opts(std::move(o)), spec(std::move(s)),
        cache(t.new_cache(opts.ctx_size)), rng(opts.sampling.seed),
        gate(spec.sps.empty() ? spec.gate_sps : spec.sps, spec.gate_memory, !opts.sampling.greedy()) {
    opts.sampling.validate();
    if (opts.top_logprobs < -1 || opts.top_logprobs > kMaxTopLogprobs)
      throw InvalidArgument("top_logprobs must be in [-1, " + std::to_string(kMaxTopLogprobs) + "], got " +
                            std::to_string(opts.top_logprobs));
    check_prompt_fits(static_cast<int64_t>(prompt.size()), cache.max_tokens(), t.info().context);
    spec.lookup.validate();
    if (spec.lookup.enabled()) {
      lookup_gamma = spec.lookup.max_draft;
      history = prompt;
    }
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
    }
    if (speculative()) {
      const auto n = static_cast<size_t>(std::max(gamma, lookup_gamma));
      res.stats.reached_by_position.assign(n, 0);
      res.stats.accepted_by_position.assign(n, 0);
      lookup_reached.assign(n, 0);
      lookup_accepted.assign(n, 0);
    }
    res.stats.prompt_tokens = static_cast<int64_t>(prompt.size());
  }

  bool speculative() const { return drafter != nullptr || lookup_gamma > 0; }

  // Conditional acceptance of lookup drafts at position k, from this
  // sequence's lookup rounds so far: the position's own counts shrunk
  // towards the rate of every position pooled (weight of 2 rounds), which
  // itself starts at 0.6 (weight 2). Positions the scheduler never verified
  // thus take the pooled rate instead of staying at the prior.
  double lookup_acceptance(int k) const {
    const double pooled =
        (static_cast<double>(lookup_accepted_all) + 1.2) / (static_cast<double>(lookup_reached_all) + 2.0);
    const auto i = static_cast<size_t>(k);
    return (static_cast<double>(lookup_accepted[i]) + 2.0 * pooled) / (static_cast<double>(lookup_reached[i]) + 2.0);
  }

  // A lookup draft of at most `g` tokens for the coming round; false when
  // the history holds no match.
  bool draft_lookup(int g) {
    std::vector<TokenId> toks = lookup_draft(history, spec.lookup.min_ngram, spec.lookup.max_ngram, g);
    if (toks.empty()) return false;
    dr_lookup = true;
    dr_acceptance.clear();
    for (int k = 0; k < static_cast<int>(toks.size()); ++k) {
      const double c = lookup_acceptance(k);
      dr_acceptance.push_back(c);
      dr.conf_logits.push_back(static_cast<float>(std::log(c / (1.0 - c))));
      if (!opts.sampling.greedy()) dr.q.push_back(Distribution{{toks[static_cast<size_t>(k)]}, {1.f}});
    }
    dr.tokens = std::move(toks);
    return true;
  }

  void defer_context(const at::Tensor& taps) {
    pending_taps.push_back(taps.clone());  // the forward's buffer is reused
    pending_rows += taps.size(0);
    last_rows = taps.size(0);
    // Bounded memory while lookup drafts run for a long time.
    if (pending_rows >= kMaxPendingRows) flush_context();
  }
  void flush_context() {
    if (pending_taps.empty()) return;
    drafter->append_context(ds, pending_taps.size() == 1 ? pending_taps[0] : at::cat(pending_taps, 0));
    pending_taps.clear();
    pending_rows = 0;
  }
  static constexpr int64_t kMaxPendingRows = 256;

  bool is_stop(TokenId t) const {
    return std::find(opts.stop_ids.begin(), opts.stop_ids.end(), t) != opts.stop_ids.end();
  }

  // Emits one token, picked from the target's logits `row` [V]; returns
  // false (and finishes) when generation must end.
  bool emit(TokenId t, const float* row) {
    if (is_stop(t)) {
      res.stopped_by_eog = true;
      res.stop_token = t;
      return finish();
    }
    res.tokens.push_back(t);
    if (opts.top_logprobs >= 0)
      res.logprobs.push_back(token_logprobs(row, target.info().vocab, t, opts.top_logprobs));
    if (lookup_gamma > 0) history.push_back(t);
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
bool SpecSession::lookup_round() const { return impl_->dr_lookup; }
std::vector<double> SpecSession::survival(const std::vector<double>& temperatures) const {
  const Impl& s = *impl_;
  if (!s.dr_lookup) return calibrated_survival(s.dr.conf_logits, temperatures);
  std::vector<double> a;
  double run = 1.0;
  for (double c : s.dr_acceptance) a.push_back(run *= c);
  return a;
}
int SpecSession::max_verify() const { return impl_->ell; }
const TapRequest& SpecSession::taps() const { return impl_->taps; }
GenerateResult& SpecSession::result() { return impl_->res; }
const GenerateResult& SpecSession::result() const { return impl_->res; }
void SpecSession::cancel() { impl_->finish(); }

void SpecSession::set_verify_length(int ell) { impl_->ell = std::clamp(ell, 0, impl_->ell); }

void SpecSession::draft() {
  Impl& s = *impl_;
  s.dr = Draft{};
  s.dr_lookup = false;
  s.ell = 0;
  if (s.done || !s.prefilled || !s.speculative()) return;
  const int64_t room = s.cache.max_tokens() - s.cache.size() - 1;
  const int64_t budget = s.opts.n_predict - static_cast<int64_t>(s.res.tokens.size());
  const auto t0 = Clock::now();
  const int g_lookup = static_cast<int>(std::min<int64_t>({s.lookup_gamma, room, budget}));
  const int g = static_cast<int>(std::min<int64_t>({s.gamma, room, budget}));
  if (!(g_lookup > 0 && s.draft_lookup(g_lookup)) && s.drafter && g > 0 && s.gate.should_draft()) {
    const double share =
        s.pending_rows > 0 ? std::min(1.0, static_cast<double>(s.last_rows) / static_cast<double>(s.pending_rows)) : 1.0;
    const auto tf = Clock::now();
    s.flush_context();
    const auto td = Clock::now();
    s.dr = s.drafter->draft(s.ds, s.anchor, g, s.opts.sampling, s.rng);
    s.dr_s = seconds(t0, tf) + share * seconds(tf, td) + seconds(td, Clock::now());
  }
  s.res.stats.draft_s += seconds(t0, Clock::now());
  s.ell = static_cast<int>(s.dr.tokens.size());
}

void SpecSession::skip_draft() {
  Impl& s = *impl_;
  s.dr = Draft{};
  s.dr_lookup = false;
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
    const float* last = out.logits.data_ptr<float>();
    s.anchor = s.target_token(last, V, s.n_prefilled);
    s.prefilled = true;
    s.t_prefilled = Clock::now();
    st.prefill_s = seconds(s.t_start, s.t_prefilled);
    if (s.emit(s.anchor, last)) s.after_anchor();
    return;
  }
  const float* logits = out.logits.data_ptr<float>();
  const double round_s = seconds(s.t_call, Clock::now());
  st.verify_s += round_s;
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
  if (s.speculative()) {
    ++st.rounds;
    st.drafted += ell;
    st.accepted += n_acc;
    for (int k = 0; k < ell && k <= n_acc; ++k) {
      ++st.reached_by_position[k];
      if (k < n_acc) ++st.accepted_by_position[k];
      if (s.dr_lookup) {
        ++s.lookup_reached[k];
        ++s.lookup_reached_all;
        if (k < n_acc) {
          ++s.lookup_accepted[k];
          ++s.lookup_accepted_all;
        }
      }
    }
    if (s.dr_lookup) {
      ++st.lookup_rounds;
      st.lookup_drafted += ell;
      st.lookup_accepted += n_acc;
    } else if (!s.dr.tokens.empty()) {
      ++st.drafter_rounds;
      s.gate.record(ell, n_acc, s.dr_s, round_s);
      if (s.spec.on_round)
        for (int k = 0; k < ell; ++k) s.spec.on_round(k, s.dr.conf_logits[k], k < n_acc);
    } else if (s.drafter) {
      s.gate.record_plain(round_s);  // nothing drafted: a plain step's cost
    }
    // Roll back the rejected tail; the anchor and accepted drafts extend the
    // drafter's context.
    s.cache.trim(ell - n_acc);
    if (s.drafter) s.defer_context(out.taps.narrow(0, 0, n_acc + 1));
  }
  // Row k of the verify output is the target's distribution at the k-th
  // emitted token of the round, exactly as plain decoding computes it.
  for (int k = 0; k < n_acc; ++k)
    if (!s.emit(s.dr.tokens[k], logits + k * V)) return;
  s.anchor = next;
  if (s.emit(next, logits + n_acc * V)) s.after_anchor();
}

}  // namespace dspark
