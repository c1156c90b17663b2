// ops/compute_threads.hpp: a thread's OpenMP workers end when released and
// start again with its next parallel region.
#include "dspark/ops/compute_threads.hpp"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>

namespace dspark::ops {
namespace {

// The process's threads, as the kernel lists them.
int os_threads() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// A parallel region on 3 threads (2 workers beside the calling thread).
void region_of_three() {
  at::set_num_threads(3);
  std::atomic<int> chunks{0};
  at::parallel_for(0, 64, 1, [&](int64_t, int64_t) { chunks.fetch_add(1); });
  ASSERT_GE(chunks.load(), 1);
}

TEST(ComputeThreads, ReleasedWorkersEndAndStartAgain) {
  const int before = at::get_num_threads();
  region_of_three();
  const int with_team = os_threads();
  ASSERT_TRUE(release_worker_threads());
  const int released = os_threads();
  EXPECT_LE(released, with_team - 2);  // at least the region's 2 workers ended
  region_of_three();
  EXPECT_GE(os_threads(), released + 2);
  at::set_num_threads(before);
}

}  // namespace
}  // namespace dspark::ops
