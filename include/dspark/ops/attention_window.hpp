// dspark/ops/attention_window.hpp — causal sliding-window attention over a
// ring-buffer KV cache: the local layers of Gemma 2/3 (and Mistral-style
// sliding windows), where query position p attends to the `window` most
// recent positions p - window + 1 .. p.
//
// The cache of such a layer holds only the last `cap` positions: position p
// lives in row p % cap, so a cache of window + T - 1 rows serves a call of T
// new tokens (see KVCache). Keys are visited in position order whatever rows
// they occupy, so a result does not depend on the ring's size or rotation.
#pragma once

#include <cstdint>

namespace dspark::ops {

/// q: [T, n_heads, hd] fp32 (row stride q_stride): the queries of positions
/// n_past .. n_past + T - 1. K, V: [n_kv, cap, hd] fp32 rings holding the
/// key/value of position p in row p % cap, the T new ones already written.
/// Query t (position p = n_past + t) attends to positions
/// max(0, p - window + 1) .. p, scores scaled by `scale`; head h reads KV
/// group h / (n_heads / n_kv). out: [T, n_heads * hd] fp32.
///
/// Batch invariant: each (t, head) is one fixed sequence of fp32 operations,
/// those of ops::attention (kernels.hpp) over the keys in position order, on
/// every kernel level. Parallel over (t, head) with ATen threads.
/// Throws dspark::InvalidArgument when hd is not a multiple of 16, window < 1,
/// or cap < min(n_past + T, window + T - 1) (a needed key would have been
/// overwritten).
void attention_window(const float* q, int64_t q_stride, const float* K, const float* V, int64_t cap,
                      int64_t n_past, int64_t T, int64_t n_heads, int64_t n_kv, int64_t hd, int64_t window,
                      float scale, float* out);

}  // namespace dspark::ops
