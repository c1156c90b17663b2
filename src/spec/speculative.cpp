// The speculative decoding loop; see include/dspark/spec/speculative.hpp.
#include "dspark/spec/speculative.hpp"

#include <algorithm>
#include <chrono>

#include "dspark/error.hpp"

namespace dspark {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<double> resolve_thresholds(const DraftModel& d, const SpecOptions& s, int gamma) {
  if (!s.prune) return {};
  if (s.min_conf >= 0) return std::vector<double>(static_cast<size_t>(gamma), s.min_conf);
  if (s.thresholds) return *s.thresholds;
  return d.calibrated_thresholds();
}
}  // namespace

GenerateResult generate_speculative(TargetModel& target, const DraftModel& drafter,
                                    const std::vector<TokenId>& prompt, const GenerateOptions& opts,
                                    const SpecOptions& spec) {
  opts.sampling.validate();
  const auto& ti = target.info();
  drafter.check_target(ti);
  const int gamma = spec.gamma > 0 ? spec.gamma : drafter.gamma();
  if (gamma > kMaxGamma)
    throw InvalidArgument("gamma must be in [1, " + std::to_string(kMaxGamma) + "], got " +
                          std::to_string(gamma));
  const std::vector<double> thresholds = resolve_thresholds(drafter, spec, gamma);
  const int64_t V = ti.vocab;
  KVCache cache = target.new_cache(opts.ctx_size);
  check_prompt_fits(static_cast<int64_t>(prompt.size()), cache.max_tokens());
  Rng rng(opts.sampling.seed);
  const bool greedy = opts.sampling.greedy();
  auto is_stop = [&](TokenId t) {
    return std::find(opts.stop_ids.begin(), opts.stop_ids.end(), t) != opts.stop_ids.end();
  };
  TapRequest taps{drafter.tap_layers(), false};

  GenerateResult res;
  auto& st = res.stats;
  st.prompt_tokens = static_cast<int64_t>(prompt.size());
  st.reached_by_position.assign(static_cast<size_t>(gamma), 0);
  st.accepted_by_position.assign(static_cast<size_t>(gamma), 0);

  const auto t0 = Clock::now();
  ForwardOut out = target.forward_one(cache, prompt, Logits::Last, taps);
  DraftState ds;
  drafter.append_context(ds, out.taps);
  TokenId anchor = pick_token(out.logits.data_ptr<float>(), V, opts.sampling, rng);
  st.prefill_s = since(t0);

  const auto t1 = Clock::now();
  // Emits one token; returns false when generation must end.
  auto emit = [&](TokenId t) {
    if (is_stop(t)) {
      res.stopped_by_eog = true;
      return false;
    }
    res.tokens.push_back(t);
    if (opts.on_token && !opts.on_token(t)) return false;
    return static_cast<int64_t>(res.tokens.size()) < opts.n_predict;
  };

  while (emit(anchor)) {
    // The anchor goes in at position cache.size(); room is needed for it.
    const int64_t room = cache.max_tokens() - cache.size() - 1;
    if (room < 0) break;
    const int64_t budget = opts.n_predict - static_cast<int64_t>(res.tokens.size());
    const int g = static_cast<int>(std::min<int64_t>({gamma, room, budget}));

    Draft dr;
    int ell = 0;
    if (g > 0) {
      const auto td = Clock::now();
      dr = drafter.draft(ds, anchor, g, opts.sampling, rng);
      st.draft_s += since(td);
      ell = prune_length(dr.conf_logits, thresholds);
    }
    std::vector<TokenId> block{anchor};
    block.insert(block.end(), dr.tokens.begin(), dr.tokens.begin() + ell);

    const auto tv = Clock::now();
    out = target.forward_one(cache, block, Logits::All, taps);
    st.verify_s += since(tv);
    ++st.target_calls;
    ++st.rounds;
    const float* logits = out.logits.data_ptr<float>();

    int n_acc = 0;
    TokenId next = -1;
    if (greedy) {
      while (n_acc < ell && dr.tokens[n_acc] == argmax(logits + n_acc * V, V)) ++n_acc;
      next = argmax(logits + n_acc * V, V);
    } else {
      for (; n_acc < ell; ++n_acc) {
        Distribution p = process_logits(logits + n_acc * V, V, opts.sampling);
        if (!accept_token(p, dr.q[n_acc], dr.tokens[n_acc], rng.uniform())) {
          next = sample(residual(p, dr.q[n_acc]), rng);
          break;
        }
      }
      if (n_acc == ell) next = sample(process_logits(logits + ell * V, V, opts.sampling), rng);
    }
    st.drafted += ell;
    st.accepted += n_acc;
    for (int k = 0; k < ell && k <= n_acc; ++k) {
      ++st.reached_by_position[k];
      if (k < n_acc) ++st.accepted_by_position[k];
    }
    if (spec.on_round)
      for (int k = 0; k < ell; ++k) spec.on_round(k, dr.conf_logits[k], k < n_acc);

    // Roll back the rejected tail, extend the drafter's context with the
    // anchor and the accepted drafts.
    cache.trim(ell - n_acc);
    drafter.append_context(ds, out.taps.narrow(0, 0, n_acc + 1));

    bool going = true;
    for (int k = 0; k < n_acc && going; ++k) going = emit(dr.tokens[k]);
    if (!going) break;
    anchor = next;
  }
  st.decode_s = since(t1);
  st.generated_tokens = static_cast<int64_t>(res.tokens.size());
  return res;
}

}  // namespace dspark
