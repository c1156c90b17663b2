// attention_group.hpp — several queries of one KV group in one pass over its
// keys and values (internal; the drivers ops::attention and
// ops::attention_window split their (position, head) queries into such
// groups). Each query's result is the same sequence of operations whatever
// group it is in: scores per key, its softmax numerators, then P·V over its
// keys in position order.
#pragma once

#include <cstdint>
#include <vector>

#include "kernel_table.hpp"

namespace dspark::ops::detail {

/// Queries per pass (their accumulators stay in L1).
constexpr int kMaxGroupQueries = 8;

/// Up to kMaxGroupQueries queries (hd values each) over the keys and values of
/// positions 0 .. L-1 (L per query), position j stored in row r0 + j for
/// j < L1 and in row j - L1 after that (a ring buffer that wrapped), rows hd
/// apart in K and V.
class GroupAttention {
 public:
  GroupAttention(int64_t max_len, int64_t hd);
  /// Adds the queries of heads [h0, h1) at position t of a [T, n_heads, hd]
  /// query block (row stride q_stride; outputs [T, n_heads * hd]), each over
  /// L keys, to the next pass.
  void add_heads(const float* q, int64_t q_stride, float* out, int64_t n_heads, int64_t t, int64_t h0, int64_t h1,
                 int64_t L);
  /// Runs the pass over the added queries and empties it.
  void run(const KernelTable& kt, const float* K, const float* V, int64_t r0, int64_t L1, float scale);

 private:
  std::vector<float> p_, acc_;
  int64_t max_len_, hd_;
  int nq_ = 0;
  const float* q_[kMaxGroupQueries] = {};
  float* out_[kMaxGroupQueries] = {};
  int64_t L_[kMaxGroupQueries] = {};
};

/// How many heads and positions of one KV group go in a pass: up to
/// kMaxGroupQueries queries, with at least `min_units` passes over the
/// (n_kv x heads x positions) queries when halving the heads allows it (so
/// every thread gets work). Returns {heads, positions} per pass.
struct GroupShape {
  int64_t heads, positions;
};
GroupShape group_shape(int64_t group, int64_t n_kv, int64_t T, bool share_positions, int64_t min_units);

}  // namespace dspark::ops::detail
