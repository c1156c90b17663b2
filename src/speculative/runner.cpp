// The one driver of SpecSessions; see include/dspark/speculative/runner.hpp.
#include "dspark/speculative/runner.hpp"

#include <algorithm>
#include <exception>
#include <vector>

#include "dspark/speculative/scheduler.hpp"

namespace dspark {

int64_t prefill_attention_span(const TargetInfo& t) {
  // Multiply-adds per token and layer: q, k, v, o projections and the gated MLP.
  const int64_t q = t.n_heads * t.head_dim, kv = t.n_kv_heads * t.head_dim;
  const int64_t weights = t.hidden * (2 * q + 2 * kv) + 3 * t.hidden * t.ffn;
  // Attention per context position: scores and the weighted sum over values,
  // which run kAttentionSlowdown times slower per multiply-add than the
  // quantized matmuls.
  const int64_t per_position = std::max<int64_t>(2 * q * kAttentionSlowdown, 1);
  return std::max<int64_t>(weights / per_position, 1);
}

double prefill_cost(int64_t n, int64_t context, int64_t span) {
  const double nn = static_cast<double>(n);
  return nn + (nn * static_cast<double>(context) + nn * (nn - 1) / 2) / static_cast<double>(span);
}

int64_t timed_prefill_budget(const std::vector<double>& sps, int64_t decoding, double slowdown, int64_t cap) {
  if (decoding <= 0 || sps.empty() || !(slowdown > 0)) return cap;
  const double limit = slowdown / sps_at(sps, decoding);
  int64_t p = 0;
  while (p < cap && 1.0 / sps_at(sps, decoding + p + 1) <= limit) ++p;
  return p;
}

BatchRunner::BatchRunner(TargetModel& target, const DraftModel* drafter, const SpecOptions& spec, RunnerOptions opts)
    : target_(target), drafter_(drafter), policy_(spec, drafter), opts_(opts),
      span_(prefill_attention_span(target.info())) {}

namespace {
// The most tokens of `s`'s remaining prompt that fit in `budget` (0 if none).
int64_t chunk_within(const SpecSession& s, double budget, int64_t span) {
  int64_t lo = 0, hi = s.prefill_remaining();
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (prefill_cost(mid, s.prefilled_tokens(), span) <= budget) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}
}  // namespace

int64_t BatchRunner::step(std::span<SpecSession* const> sessions, const ErrorHandler& on_error) {
  auto guarded = [&](SpecSession& s, auto&& fn) {
    if (!on_error) return fn();
    try {
      fn();
    } catch (const std::exception& e) {
      s.cancel();
      on_error(s, e.what());
    }
  };
  std::vector<SpecSession*> prefilling, decoding;
  int64_t before = 0;
  for (SpecSession* s : sessions) {
    if (s->finished()) continue;
    before += static_cast<int64_t>(s->result().tokens.size());
    (s->prefilling() ? prefilling : decoding).push_back(s);
  }
  // 1. Prefill chunks, shortest remainder first.
  std::vector<SpecSession*> batch;
  int64_t prefill_tokens = 0;
  if (opts_.prefill_budget > 0) {
    std::stable_sort(prefilling.begin(), prefilling.end(), [](const SpecSession* a, const SpecSession* b) {
      return a->prefill_remaining() < b->prefill_remaining();
    });
    double left = static_cast<double>(timed_prefill_budget(
        opts_.sps, static_cast<int64_t>(decoding.size()), opts_.prefill_slowdown, opts_.prefill_budget));
    for (SpecSession* s : prefilling) {
      int64_t n = chunk_within(*s, left, span_);
      if (n == 0 && batch.empty()) n = 1;  // progress even when one token exceeds the budget
      if (n == 0) break;
      s->set_prefill_chunk(n);
      left -= prefill_cost(n, s->prefilled_tokens(), span_);
      prefill_tokens += n;
      batch.push_back(s);
    }
  } else {
    for (SpecSession* s : prefilling) {
      prefill_tokens += s->prefill_remaining();
      batch.push_back(s);
    }
  }
  // 2. Draft, 3. plan.
  const bool draft = policy_.drafting_pays(static_cast<int64_t>(decoding.size()), prefill_tokens);
  std::vector<SpecSession*> drafted;
  for (SpecSession* s : decoding) {
    guarded(*s, [&] {
      if (draft) s->draft();
      else s->skip_draft();
    });
    if (s->finished()) continue;
    batch.push_back(s);
    if (s->max_verify() > 0) drafted.push_back(s);
  }
  policy_.plan(drafted, prefill_tokens);
  // 4. Forward and consume.
  if (!batch.empty()) forward(batch, on_error);
  int64_t after = 0;
  for (const auto* group : {&prefilling, &decoding})
    for (SpecSession* s : *group) after += static_cast<int64_t>(s->result().tokens.size());
  return after - before;
}

void BatchRunner::forward(std::span<SpecSession* const> batch, const ErrorHandler& on_error) {
  std::vector<ForwardSeq> seqs;
  seqs.reserve(batch.size());
  TapRequest taps;
  for (SpecSession* s : batch) {
    seqs.push_back(s->forward_input());
    // Every session of one runner has the same drafter, hence the same taps.
    if (taps.layers.empty()) taps = s->taps();
  }
  std::vector<ForwardOut> outs;
  try {
    outs = target_.forward(std::span<ForwardSeq>(seqs), taps);
  } catch (const std::exception& e) {
    if (!on_error) throw;
    if (batch.size() == 1) {
      batch[0]->cancel();
      on_error(*batch[0], e.what());
      return;
    }
    // Find the session at fault: run each on its own (a failed call leaves
    // the caches unchanged).
    for (SpecSession* s : batch) forward(std::span<SpecSession* const>(&s, 1), on_error);
    return;
  }
  ++calls_;
  for (size_t i = 0; i < batch.size(); ++i) {
    SpecSession& s = *batch[i];
    if (!on_error) {
      s.consume(outs[i]);
      continue;
    }
    try {
      s.consume(outs[i]);
    } catch (const std::exception& e) {
      s.cancel();
      on_error(s, e.what());
    }
  }
}

GenerateResult run_session(TargetModel& target, const DraftModel* drafter, SpecSession& session,
                           const SpecOptions& spec) {
  BatchRunner runner(target, drafter, spec);
  SpecSession* one = &session;
  while (!session.finished()) runner.step(std::span<SpecSession* const>(&one, 1));
  return std::move(session.result());
}

GenerateResult generate_plain(TargetModel& model, const std::vector<TokenId>& prompt, const GenerateOptions& opts) {
  SpecSession s(model, nullptr, prompt, opts);
  return run_session(model, nullptr, s, {});
}

GenerateResult generate_speculative(TargetModel& target, const DraftModel& drafter,
                                    const std::vector<TokenId>& prompt, const GenerateOptions& opts,
                                    const SpecOptions& spec) {
  SpecSession s(target, &drafter, prompt, opts, spec);
  return run_session(target, &drafter, s, spec);
}

}  // namespace dspark
