// parallel.hpp — the ops' parallel loop (internal).
#pragma once

#include <ATen/Parallel.h>

#include <cstdint>

namespace dspark::ops::detail {

/// at::parallel_for(begin, end, grain, f), except that a range of at most one
/// grain runs on the calling thread. ATen opens a parallel region (a fork and
/// a join, a few microseconds with two threads) whenever the range is not
/// below the grain, even when it holds one task and the other threads get
/// nothing: a one-token step has several such one-row tasks in every layer
/// (activation quantization, RoPE, the gated activation). Which thread runs a
/// task never changes a result (kernel_table.hpp's contract).
template <class F>
void parallel_tasks(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (end <= begin) return;
  if (end - begin <= grain) {
    f(begin, end);
    return;
  }
  at::parallel_for(begin, end, grain, f);
}

}  // namespace dspark::ops::detail
