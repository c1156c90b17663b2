// dspark/model/kv_cache.hpp — per-sequence key/value cache with rollback.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dspark {

/// Keys and values of one sequence for every layer of a target model.
/// Layout per layer: K and V are [n_kv_heads, capacity, head_dim] fp32.
/// Storage grows geometrically up to `max_tokens` (the context length), so a
/// short conversation does not pay for the full context.
class KVCache {
 public:
  /// n_layers, n_kv_heads, head_dim: the model's geometry; max_tokens: the
  /// context length (tokens). Allocates nothing until tokens arrive.
  KVCache(int64_t n_layers, int64_t n_kv_heads, int64_t head_dim, int64_t max_tokens);

  /// Number of positions currently held (the next token's position).
  int64_t size() const { return n_past_; }
  /// Context length in tokens.
  int64_t max_tokens() const { return max_tokens_; }
  /// Allocated positions per layer.
  int64_t capacity() const { return capacity_; }

  /// Drops the last `n` positions (speculative rollback). Throws
  /// dspark::InvalidArgument when n < 0 or n > size().
  void trim(int64_t n);
  /// Drops everything.
  void clear() { n_past_ = 0; }

  /// Ensures room for `n` more positions; throws dspark::InvalidArgument
  /// ("context length exceeded: ...") when size() + n > max_tokens().
  void reserve_more(int64_t n);
  /// Marks `n` more positions as filled (after the forward wrote them).
  void advance(int64_t n) { n_past_ += n; }

  /// Base pointers of layer `l` ([n_kv_heads, capacity, head_dim] each).
  float* keys(int64_t l) { return k_[static_cast<size_t>(l)].data(); }
  float* values(int64_t l) { return v_[static_cast<size_t>(l)].data(); }

  /// Bytes currently allocated.
  int64_t bytes() const;

 private:
  int64_t n_layers_, n_kv_, head_dim_, max_tokens_;
  int64_t capacity_ = 0;
  int64_t n_past_ = 0;
  std::vector<std::vector<float>> k_, v_;
};

}  // namespace dspark
