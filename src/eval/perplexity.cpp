// Perplexity with llama-perplexity's chunking and scoring; see perplexity.hpp.
#include "dspark/eval/perplexity.hpp"

#include <cmath>
#include <string>

#include "dspark/error.hpp"

namespace dspark::eval {

int64_t perplexity_chunks(const TargetModel& target, int64_t n_tokens, const PerplexityOptions& o) {
  const int64_t n_ctx = o.n_ctx;
  if (n_ctx < 4) throw InvalidArgument("perplexity: context of " + std::to_string(n_ctx) + " tokens, need at least 4");
  if (target.info().context > 0 && n_ctx > target.info().context)
    throw InvalidArgument("perplexity: context of " + std::to_string(n_ctx) + " tokens exceeds the model's " +
                          std::to_string(target.info().context));
  const int64_t available = n_tokens / n_ctx;
  if (available == 0)
    throw InvalidArgument("perplexity: the text has " + std::to_string(n_tokens) +
                          " tokens, fewer than one chunk of " + std::to_string(n_ctx) + " (-c)");
  return o.max_chunks < 0 ? available : std::min(available, o.max_chunks);
}

PerplexityResult perplexity(TargetModel& target, std::span<const TokenId> tokens, const PerplexityOptions& o,
                            const std::function<void(int64_t, double)>& on_chunk) {
  const int64_t n_ctx = o.n_ctx, V = target.info().vocab;
  const int64_t n_chunks = perplexity_chunks(target, static_cast<int64_t>(tokens.size()), o);
  const int64_t first = n_ctx / 2;
  PerplexityResult r;
  double nll = 0, nll2 = 0;
  std::vector<TokenId> chunk(static_cast<size_t>(n_ctx));
  for (int64_t c = 0; c < n_chunks; ++c) {
    const TokenId* src = tokens.data() + c * n_ctx;
    chunk.assign(src, src + n_ctx);
    if (o.bos >= 0) chunk[0] = o.bos;
    KVCache cache = target.new_cache(n_ctx);
    const at::Tensor logits = target.forward_one(cache, chunk, Logits::All).logits;  // [n_ctx, V]
    const float* lp = logits.data_ptr<float>();
    for (int64_t j = first; j < n_ctx - 1; ++j) {
      // -log softmax(row j)[next token], in double as llama.cpp does.
      const float* row = lp + j * V;
      float mx = row[0];
      for (int64_t v = 1; v < V; ++v) mx = std::max(mx, row[v]);
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v] - mx));
      const double x = std::log(sum) - static_cast<double>(row[src[j + 1]] - mx);
      nll += x;
      nll2 += x * x;
    }
    r.scored += n_ctx - 1 - first;
    r.running.push_back(std::exp(nll / static_cast<double>(r.scored)));
    ++r.chunks;
    if (on_chunk) on_chunk(c, r.running.back());
  }
  const double n = static_cast<double>(r.scored);
  r.nll = nll / n;
  r.ppl = std::exp(r.nll);
  const double var = nll2 / n - r.nll * r.nll;
  r.ppl_error = var > 0 && r.scored > 1 ? std::sqrt(var / (n - 1)) * r.ppl : 0.0;
  return r;
}

}  // namespace dspark::eval
