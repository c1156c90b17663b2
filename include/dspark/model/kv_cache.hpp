// dspark/model/kv_cache.hpp — per-sequence key/value cache with rollback,
// including sliding-window layers kept in ring buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dspark {

/// Keys and values of one sequence for every layer of a target model.
/// Layout per layer: K and V are [n_kv_heads, capacity(l), head_dim] fp32,
/// and position p lives in row p % capacity(l).
///
/// A layer attending to every earlier position (window 0) keeps them all:
/// its storage grows geometrically up to `max_tokens` (the context length),
/// so a short conversation does not pay for the full context, and p < capacity.
///
/// A sliding-window layer (window W: position p attends to p - W + 1 .. p)
/// keeps a ring of at most W - 1 + max(T, 64) rows, T being the largest number
/// of tokens one forward call added (reserve_more grows it). Rollback stays
/// exact after the ring has wrapped: trim(n) restores exactly the keys the
/// layer would hold had the dropped positions never been written, as long as
/// those keys have not been overwritten — always the case for dropping at most
/// the tokens of the last call (a speculative draft) — and it throws
/// otherwise rather than let decoding diverge.
class KVCache {
 public:
  /// n_layers, n_kv_heads, head_dim: the model's geometry; max_tokens: the
  /// context length (tokens); windows: [n_layers] keys each layer attends to
  /// (0 = all earlier positions; empty = 0 for every layer). Allocates nothing
  /// until tokens arrive. Throws dspark::InvalidArgument on a non-positive
  /// dimension, a negative window or a windows list of another length.
  KVCache(int64_t n_layers, int64_t n_kv_heads, int64_t head_dim, int64_t max_tokens,
          std::vector<int64_t> windows = {});

  /// Number of positions currently held (the next token's position).
  int64_t size() const { return n_past_; }
  /// Context length in tokens.
  int64_t max_tokens() const { return max_tokens_; }
  /// Rows allocated for layer `l` (position p is row p % capacity(l)).
  int64_t capacity(int64_t l) const { return cap_[static_cast<size_t>(l)]; }
  /// Keys layer `l` attends to (0 = all earlier positions).
  int64_t window(int64_t l) const { return window_[static_cast<size_t>(l)]; }

  /// Drops the last `n` positions (speculative rollback). Throws
  /// dspark::InvalidArgument when n < 0 or n > size(), or when a
  /// sliding-window layer has already overwritten a key that position
  /// size() - n attends to; the cache is unchanged then.
  void trim(int64_t n);
  /// Drops everything.
  void clear();

  /// Ensures room for a call of `n` more positions; throws
  /// dspark::InvalidArgument ("context length exceeded: ...") when
  /// size() + n > max_tokens().
  void reserve_more(int64_t n);
  /// Marks `n` more positions as filled (after the forward wrote them).
  void advance(int64_t n);

  /// Base pointers of layer `l` ([n_kv_heads, capacity(l), head_dim] each).
  float* keys(int64_t l) { return k_[static_cast<size_t>(l)].data(); }
  float* values(int64_t l) { return v_[static_cast<size_t>(l)].data(); }

  /// Bytes currently allocated.
  int64_t bytes() const;

 private:
  void resize_layer(size_t l, int64_t cap);
  int64_t n_layers_, n_kv_, head_dim_, max_tokens_;
  int64_t n_past_ = 0;
  std::vector<int64_t> window_, cap_;
  /// Per layer: positions below this may have been overwritten (rings only).
  std::vector<int64_t> valid_from_;
  std::vector<std::vector<float>> k_, v_;
};

}  // namespace dspark
