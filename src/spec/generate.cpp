// Plain decoding and the shared generation helpers; see generate.hpp.
#include "dspark/spec/generate.hpp"

#include <algorithm>
#include <chrono>

#include "dspark/error.hpp"

namespace dspark {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

double GenerateStats::tau() const {
  if (rounds == 0) return generated_tokens > 0 ? 1.0 : 0.0;  // plain decoding
  return static_cast<double>(accepted + rounds) / static_cast<double>(rounds);
}

std::vector<double> GenerateStats::acceptance_by_position() const {
  std::vector<double> a(reached_by_position.size(), 0.0);
  for (size_t k = 0; k < a.size(); ++k)
    a[k] = reached_by_position[k] > 0
               ? static_cast<double>(accepted_by_position[k]) / reached_by_position[k]
               : 0.0;
  return a;
}

TokenId pick_token(const float* logits, int64_t V, const SamplingParams& p, Rng& rng) {
  if (p.greedy()) return argmax(logits, V);
  return sample(process_logits(logits, V, p), rng);
}

void check_prompt_fits(int64_t prompt_tokens, int64_t ctx_size) {
  if (prompt_tokens <= 0) throw InvalidArgument("the prompt is empty: at least one token is needed");
  if (prompt_tokens >= ctx_size) {
    throw InvalidArgument("prompt too long: " + std::to_string(prompt_tokens) +
                          " tokens, the context holds " + std::to_string(ctx_size) +
                          " (including at least one generated token)");
  }
}

GenerateResult generate_plain(TargetModel& model, const std::vector<TokenId>& prompt,
                              const GenerateOptions& opts) {
  opts.sampling.validate();
  const int64_t V = model.info().vocab;
  KVCache cache = model.new_cache(opts.ctx_size);
  check_prompt_fits(static_cast<int64_t>(prompt.size()), cache.max_tokens());
  Rng rng(opts.sampling.seed);
  auto is_stop = [&](TokenId t) {
    return std::find(opts.stop_ids.begin(), opts.stop_ids.end(), t) != opts.stop_ids.end();
  };

  GenerateResult res;
  res.stats.prompt_tokens = static_cast<int64_t>(prompt.size());
  const auto t0 = Clock::now();
  ForwardOut out = model.forward_one(cache, prompt, Logits::Last);
  TokenId next = pick_token(out.logits.data_ptr<float>(), V, opts.sampling, rng);
  res.stats.prefill_s = since(t0);
  const auto t1 = Clock::now();
  while (static_cast<int64_t>(res.tokens.size()) < opts.n_predict) {
    if (is_stop(next)) {
      res.stopped_by_eog = true;
      break;
    }
    res.tokens.push_back(next);
    if (opts.on_token && !opts.on_token(next)) break;
    if (static_cast<int64_t>(res.tokens.size()) >= opts.n_predict ||
        cache.size() >= cache.max_tokens())
      break;
    out = model.forward_one(cache, std::span<const TokenId>(&next, 1), Logits::Last);
    ++res.stats.target_calls;
    next = pick_token(out.logits.data_ptr<float>(), V, opts.sampling, rng);
  }
  res.stats.decode_s = since(t1);
  res.stats.generated_tokens = static_cast<int64_t>(res.tokens.size());
  return res;
}

}  // namespace dspark
