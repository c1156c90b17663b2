// The HTTP library's task queue for dspark serve: a thread pool that grows.
//
// cpp-httplib runs each connection on one pool thread from accept to close,
// so a connection that sends nothing (an idle keep-alive client, a slow or
// hostile one) holds its thread until the read timeout. With a fixed pool a
// few hundred such connections queue every other client behind them,
// /health included. This pool keeps `floor` threads and starts another
// whenever a connection arrives and none is idle, up to `ceiling`; threads
// above the floor leave after `linger` without work.
#pragma once

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

namespace dspark::serve {

class ElasticPool final : public httplib::TaskQueue {
 public:
  /// Throws InvalidArgument unless 1 <= floor <= ceiling.
  ElasticPool(size_t floor, size_t ceiling, std::chrono::milliseconds linger = std::chrono::seconds(10));
  ~ElasticPool() override;
  ElasticPool(const ElasticPool&) = delete;
  ElasticPool& operator=(const ElasticPool&) = delete;

  void enqueue(std::function<void()> fn) override;
  /// Runs the queued tasks, then joins every thread.
  void shutdown() override;

  size_t threads() const;  // running now
  size_t peak() const;     // most running at once

 private:
  void work(std::list<std::thread>::iterator self);
  void join_retired();  // under mu_

  const size_t floor_, ceiling_;
  const std::chrono::milliseconds linger_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::list<std::thread> threads_;
  std::vector<std::list<std::thread>::iterator> retired_;  // finished, not yet joined
  size_t running_ = 0, idle_ = 0, peak_ = 0;
  bool stop_ = false;
};

}  // namespace dspark::serve
