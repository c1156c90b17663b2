// Per-sequence KV cache; see include/dspark/model/kv_cache.hpp.
#include "dspark/model/kv_cache.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "dspark/error.hpp"

namespace dspark {

namespace {
// Ring rows kept beyond W - 1 when calls are short: room for a speculative
// block, so the ring is not regrown as verify lengths vary.
constexpr int64_t kRingSlack = 64;
}  // namespace

KVCache::KVCache(int64_t n_layers, int64_t n_kv_heads, int64_t head_dim, int64_t max_tokens,
                 std::vector<int64_t> windows)
    : n_layers_(n_layers), n_kv_(n_kv_heads), head_dim_(head_dim), max_tokens_(max_tokens),
      window_(std::move(windows)) {
  if (n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0 || max_tokens <= 0)
    throw InvalidArgument("KVCache: all dimensions must be positive");
  if (window_.empty()) window_.assign(static_cast<size_t>(n_layers), 0);
  if (static_cast<int64_t>(window_.size()) != n_layers)
    throw InvalidArgument("KVCache: " + std::to_string(window_.size()) + " layer windows given for " +
                          std::to_string(n_layers) + " layers");
  for (int64_t w : window_)
    if (w < 0) throw InvalidArgument("KVCache: negative sliding window " + std::to_string(w));
  cap_.assign(window_.size(), 0);
  valid_from_.assign(window_.size(), 0);
  k_.resize(window_.size());
  v_.resize(window_.size());
}

void KVCache::trim(int64_t n) {
  if (n < 0 || n > n_past_) {
    throw InvalidArgument("KVCache::trim: cannot drop " + std::to_string(n) + " of " +
                          std::to_string(n_past_) + " positions");
  }
  const int64_t keep = n_past_ - n;
  for (size_t l = 0; l < window_.size(); ++l) {
    if (window_[l] == 0) continue;
    const int64_t oldest = std::max<int64_t>(0, keep - window_[l] + 1);  // the next query's first key
    if (oldest < valid_from_[l]) {
      throw InvalidArgument("KVCache::trim: cannot drop " + std::to_string(n) + " of " + std::to_string(n_past_) +
                            " positions: layer " + std::to_string(l) + " (sliding window " +
                            std::to_string(window_[l]) + ", ring of " + std::to_string(cap_[l]) +
                            " rows) has overwritten the key of position " + std::to_string(oldest) +
                            " that position " + std::to_string(keep) + " attends to");
    }
  }
  n_past_ = keep;
}

void KVCache::clear() {
  n_past_ = 0;
  std::fill(valid_from_.begin(), valid_from_.end(), 0);
}

void KVCache::resize_layer(size_t l, int64_t cap) {
  const size_t row = static_cast<size_t>(head_dim_);
  const int64_t old = cap_[l];
  // Live positions [valid_from, n_past) move to their rows in the new size.
  const int64_t p0 = std::max(valid_from_[l], n_past_ - old);
  for (auto* store : {&k_, &v_}) {
    std::vector<float>& layer = (*store)[l];
    std::vector<float> grown(static_cast<size_t>(n_kv_ * cap) * row);
    for (int64_t h = 0; h < n_kv_ && old > 0; ++h) {
      for (int64_t p = p0; p < n_past_; ++p) {
        std::memcpy(grown.data() + static_cast<size_t>(h * cap + p % cap) * row,
                    layer.data() + static_cast<size_t>(h * old + p % old) * row, row * sizeof(float));
      }
    }
    layer.swap(grown);
  }
  valid_from_[l] = p0;
  cap_[l] = cap;
}

void KVCache::reserve_more(int64_t n) {
  const int64_t need = n_past_ + n;
  if (need > max_tokens_) {
    throw InvalidArgument("context length exceeded: " + std::to_string(need) +
                          " tokens needed, the context holds " + std::to_string(max_tokens_));
  }
  for (size_t l = 0; l < window_.size(); ++l) {
    const int64_t w = window_[l], cap = cap_[l];
    if (w == 0) {
      if (need > cap) resize_layer(l, std::min(max_tokens_, std::max<int64_t>({need, cap * 2, 256})));
      continue;
    }
    // A ring must hold every key of this call at once: from the first
    // query's oldest key to the last new position.
    const int64_t rows = std::min(need, w - 1 + n);
    if (rows <= cap) continue;
    const int64_t limit = w - 1 + std::max(n, kRingSlack);
    resize_layer(l, std::min({max_tokens_, limit, std::max<int64_t>({rows, cap * 2, 256})}));
  }
}

void KVCache::advance(int64_t n) {
  n_past_ += n;
  // Writing up to position n_past - 1 overwrote the positions below n_past - capacity.
  for (size_t l = 0; l < window_.size(); ++l)
    if (window_[l] > 0) valid_from_[l] = std::max(valid_from_[l], n_past_ - cap_[l]);
}

int64_t KVCache::bytes() const {
  int64_t rows = 0;
  for (int64_t c : cap_) rows += c;
  return 2 * n_kv_ * rows * head_dim_ * static_cast<int64_t>(sizeof(float));
}

}  // namespace dspark
