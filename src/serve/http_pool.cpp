// The growing HTTP thread pool; see http_pool.hpp.
#include "http_pool.hpp"

#include <algorithm>
#include <string>

#include "dspark/error.hpp"

namespace dspark::serve {

ElasticPool::ElasticPool(size_t floor, size_t ceiling, std::chrono::milliseconds linger)
    : floor_(floor), ceiling_(ceiling), linger_(linger) {
  if (floor < 1 || ceiling < floor)
    throw InvalidArgument("HTTP threads: need 1 <= threads <= most threads, got " + std::to_string(floor) + " and " +
                          std::to_string(ceiling));
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < floor_; ++i) {
    auto it = threads_.emplace(threads_.end());
    ++running_;
    ++idle_;
    *it = std::thread([this, it] { work(it); });
  }
  peak_ = running_;
}

ElasticPool::~ElasticPool() { shutdown(); }

void ElasticPool::enqueue(std::function<void()> fn) {
  {
    std::lock_guard lock(mu_);
    join_retired();
    jobs_.push_back(std::move(fn));
    // Every running thread is busy with a connection: start another.
    if (idle_ < jobs_.size() && running_ < ceiling_) {
      auto it = threads_.emplace(threads_.end());
      ++running_;
      ++idle_;  // from now on: it will take a job
      peak_ = std::max(peak_, running_);
      *it = std::thread([this, it] { work(it); });
    }
  }
  cv_.notify_one();
}

void ElasticPool::shutdown() {
  std::list<std::thread> all;
  {
    std::lock_guard lock(mu_);
    if (stop_ && threads_.empty()) return;
    stop_ = true;
  }
  cv_.notify_all();
  for (;;) {
    std::unique_lock lock(mu_);
    if (threads_.empty()) break;
    // Retired threads leave their entry behind; running ones are joined
    // after they see stop_ and the queue empty.
    all.splice(all.end(), threads_);
    retired_.clear();
    lock.unlock();
    for (auto& t : all)
      if (t.joinable()) t.join();
    all.clear();
  }
}

size_t ElasticPool::threads() const {
  std::lock_guard lock(mu_);
  return running_;
}

size_t ElasticPool::peak() const {
  std::lock_guard lock(mu_);
  return peak_;
}

void ElasticPool::join_retired() {
  for (auto it : retired_) {
    if (it->joinable()) it->join();
    threads_.erase(it);
  }
  retired_.clear();
}

void ElasticPool::work(std::list<std::thread>::iterator self) {
  // Counted in idle_ (from its start) whenever it runs no task.
  std::unique_lock lock(mu_);
  for (;;) {
    const bool woke = cv_.wait_for(lock, linger_, [&] { return stop_ || !jobs_.empty(); });
    if (!jobs_.empty()) {
      std::function<void()> fn = std::move(jobs_.front());
      jobs_.pop_front();
      --idle_;
      lock.unlock();
      fn();
      lock.lock();
      ++idle_;
      continue;
    }
    if (stop_ || (!woke && running_ > floor_)) break;
  }
  --idle_;
  --running_;
  if (!stop_) retired_.push_back(self);
}

}  // namespace dspark::serve
