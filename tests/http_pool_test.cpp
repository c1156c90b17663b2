// The growing HTTP thread pool (src/serve/http_pool.hpp): it starts a
// thread for every task no idle thread can take, up to its ceiling, shrinks
// back to its floor, and runs every queued task before shutdown returns.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "../src/serve/http_pool.hpp"
#include "dspark/error.hpp"

using namespace std::chrono_literals;
using dspark::serve::ElasticPool;

namespace {

// A gate the tasks wait at until it opens.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void wait() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return open; });
  }
  void release() {
    {
      std::lock_guard lock(mu);
      open = true;
    }
    cv.notify_all();
  }
};

template <typename F>
bool eventually(F f) {
  for (int i = 0; i < 500; ++i) {
    if (f()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return f();
}

}  // namespace

TEST(HttpPool, GrowsWhileEveryThreadIsBusyThenShrinksToItsFloor) {
  ElasticPool pool(2, 8, 50ms);
  EXPECT_EQ(pool.threads(), 2u);
  Gate gate;
  std::atomic<int> started{0}, done{0};
  for (int i = 0; i < 6; ++i)
    pool.enqueue([&] {
      ++started;
      gate.wait();
      ++done;
    });
  // Six blocked tasks, six threads: none waits for another to finish.
  EXPECT_TRUE(eventually([&] { return started == 6; })) << started;
  EXPECT_EQ(pool.threads(), 6u);
  gate.release();
  EXPECT_TRUE(eventually([&] { return done == 6; }));
  EXPECT_TRUE(eventually([&] { return pool.threads() == 2; })) << pool.threads();
  EXPECT_EQ(pool.peak(), 6u);
  // Retired threads are joined and the pool grows again.
  Gate gate2;
  std::atomic<int> started2{0};
  for (int i = 0; i < 3; ++i)
    pool.enqueue([&] {
      ++started2;
      gate2.wait();
    });
  EXPECT_TRUE(eventually([&] { return started2 == 3; }));
  gate2.release();
  pool.shutdown();
  EXPECT_EQ(pool.threads(), 0u);
}

TEST(HttpPool, CeilingQueuesTheRestAndShutdownRunsThem) {
  ElasticPool pool(1, 3, 1s);
  Gate gate;
  std::atomic<int> started{0}, done{0};
  for (int i = 0; i < 10; ++i)
    pool.enqueue([&] {
      ++started;
      gate.wait();
      ++done;
    });
  EXPECT_TRUE(eventually([&] { return started == 3; }));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(started, 3) << "more running than the ceiling";
  EXPECT_EQ(pool.peak(), 3u);
  gate.release();
  pool.shutdown();
  EXPECT_EQ(done, 10);
}

TEST(HttpPool, RefusesAFloorAboveTheCeiling) {
  EXPECT_THROW(ElasticPool(0, 4), dspark::InvalidArgument);
  EXPECT_THROW(ElasticPool(5, 4), dspark::InvalidArgument);
}
