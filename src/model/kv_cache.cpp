// Per-sequence KV cache; see include/dspark/model/kv_cache.hpp.
#include "dspark/model/kv_cache.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "dspark/error.hpp"

namespace dspark {

KVCache::KVCache(int64_t n_layers, int64_t n_kv_heads, int64_t head_dim, int64_t max_tokens)
    : n_layers_(n_layers), n_kv_(n_kv_heads), head_dim_(head_dim), max_tokens_(max_tokens),
      k_(static_cast<size_t>(n_layers)), v_(static_cast<size_t>(n_layers)) {
  if (n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0 || max_tokens <= 0)
    throw InvalidArgument("KVCache: all dimensions must be positive");
}

void KVCache::trim(int64_t n) {
  if (n < 0 || n > n_past_) {
    throw InvalidArgument("KVCache::trim: cannot drop " + std::to_string(n) + " of " +
                          std::to_string(n_past_) + " positions");
  }
  n_past_ -= n;
}

void KVCache::reserve_more(int64_t n) {
  const int64_t need = n_past_ + n;
  if (need > max_tokens_) {
    throw InvalidArgument("context length exceeded: " + std::to_string(need) +
                          " tokens needed, the context holds " + std::to_string(max_tokens_));
  }
  if (need <= capacity_) return;
  const int64_t cap = std::min(max_tokens_, std::max<int64_t>({need, capacity_ * 2, 256}));
  const size_t row = static_cast<size_t>(head_dim_);
  for (auto* store : {&k_, &v_}) {
    for (auto& layer : *store) {
      std::vector<float> grown(static_cast<size_t>(n_kv_ * cap) * row);
      for (int64_t h = 0; h < n_kv_ && capacity_ > 0; ++h) {
        std::memcpy(grown.data() + static_cast<size_t>(h * cap) * row,
                    layer.data() + static_cast<size_t>(h * capacity_) * row,
                    static_cast<size_t>(n_past_) * row * sizeof(float));
      }
      layer.swap(grown);
    }
  }
  capacity_ = cap;
}

int64_t KVCache::bytes() const {
  return 2 * n_layers_ * n_kv_ * capacity_ * head_dim_ * static_cast<int64_t>(sizeof(float));
}

}  // namespace dspark
