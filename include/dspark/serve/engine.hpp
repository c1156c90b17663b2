// dspark/serve/engine.hpp — continuous batching of speculative decoding
// across requests.
//
// One engine thread owns the target model. It keeps up to `parallel` active
// SpecSessions and steps them with a BatchRunner (dspark/speculative/runner.hpp):
// every step each decoding session drafts, the verify lengths are chosen
// (all drafted positions, or DSpark's prefix scheduler when an SPS profile
// is given), then ONE ragged target forward call carries every session's
// input — prefill chunks of newly admitted requests included — and each
// session consumes its share. Finished sessions are completed and their
// slots refilled from the queue.
//
// Threading contract: submit(), Request::poll/wait/cancel, load() and
// shutdown() may be called from any thread. Text reaches a Request as soon
// as the engine thread has detokenized it (UTF-8 complete, stop strings
// removed, see StopMatcher).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/serve/metrics.hpp"
#include "dspark/serve/outcome.hpp"
#include "dspark/speculative/generate.hpp"
#include "dspark/speculative/speculative.hpp"
#include "dspark/tokenizer/tokenizer.hpp"

namespace dspark {
class BatchRunner;
}

namespace dspark::serve {

/// One submitted generation: the client side of its output channel.
class Request {
 public:
  /// Waits up to `timeout` until new text is available or the request has
  /// ended, then moves the available text to the end of `text` and, when
  /// `logprobs` is given, the log-probabilities of the tokens produced since
  /// the last call to its end (requests submitted with
  /// GenerateOptions::top_logprobs >= 0; one entry per counted token, which
  /// may come before the token's text when that text is held back). Returns
  /// true when the request has ended and all of its output has been taken.
  bool poll(std::string& text, std::chrono::milliseconds timeout,
            std::vector<TokenLogprob>* logprobs = nullptr);
  /// Blocks until the request ends; returns all text not yet taken.
  std::string wait();
  /// Asks the engine to stop this request (e.g. the client went away). The
  /// engine frees its slot at its next step.
  void cancel() { cancel_.store(true); }
  /// True once cancel() was called.
  bool cancel_requested() const { return cancel_.load(); }
  /// The outcome; valid after poll() returned true or wait() returned.
  const RequestOutcome& outcome() const { return outcome_; }

 private:
  friend class Engine;
  using Clock = std::chrono::steady_clock;
  /// Engine side: appends produced text (and a token's log-probabilities)
  /// and wakes the waiting reader.
  void deliver(std::string_view text, TokenLogprob* logprob = nullptr);
  /// Engine side: appends the last text, records the outcome, marks the end.
  void complete(std::string_view tail, RequestOutcome outcome);
  /// Engine side: true when nobody is blocked in poll() or wait() and
  /// produced text has waited untaken since before `now - timeout` (the
  /// reader stopped reading).
  bool unread_since(Clock::time_point now, std::chrono::milliseconds timeout);

  std::mutex mu_;
  std::condition_variable cv_;
  std::string text_;  // produced, not yet taken
  std::vector<TokenLogprob> logprobs_;  // produced, not yet taken
  Clock::time_point pending_since_;  // when text_ last became non-empty
  int readers_ = 0;                  // threads blocked in poll() or wait()
  bool ended_ = false;
  RequestOutcome outcome_;
  std::atomic<bool> cancel_{false};
};

/// Engine configuration.
struct EngineOptions {
  int parallel = 8;   // most requests decoded together
  SpecOptions spec;   // drafter options applied to every request (spec.sps is ignored)
  /// SPS profile (target steps per second at B = 1..size() verify tokens).
  /// Non-empty with a drafter: each step's verify lengths come from
  /// schedule_prefixes() over every decoding request's calibrated survival
  /// (VerifyPolicy sps mode); empty: every request verifies all positions
  /// that survive pruning. Non-empty, drafter or not: prompt work is also
  /// budgeted by time (prefill_slowdown).
  std::vector<double> sps;
  /// Chunked prefill budget per step in target-row equivalents (runner.hpp);
  /// 0: every prompt whole in one step.
  int64_t prefill_budget = 0;
  /// With a prefill budget and an SPS profile: while requests decode, a
  /// step carries no more prompt work than keeps it within this many times
  /// the time of their decoding alone (timed_prefill_budget in runner.hpp),
  /// so a long prompt does not slow the others' tokens more than that.
  /// 0: the fixed budget only.
  double prefill_slowdown = 2.0;
  /// A request whose produced text nobody takes (poll/wait) for this long is
  /// cancelled, freeing its slot: a stream its consumer abandoned without
  /// closing it. 0: never.
  std::chrono::milliseconds unread_timeout{0};
  /// The most requests that may wait for a slot beyond the free ones;
  /// submit() throws QueueFull past it. 0: no limit.
  int max_queue = 0;
};

/// submit() when EngineOptions::max_queue requests already wait: the client
/// should come back later (HTTP 503 with Retry-After).
class QueueFull : public Error {
 public:
  using Error::Error;
};

/// Current occupancy, for health reports.
struct EngineLoad {
  int active = 0;             // requests in the decode batch
  int queued = 0;             // requests waiting for a slot
  int parallel = 0;           // slots
  int64_t steps = 0;          // target forward calls so far
  int64_t completed = 0;      // requests ended so far
  int max_queue = 0;          // EngineOptions::max_queue
  /// Requests waiting beyond the free slots (what max_queue bounds).
  int waiting() const { return std::max(0, queued - (parallel - active)); }
  /// True when submit() would throw QueueFull.
  bool full() const { return max_queue > 0 && waiting() >= max_queue; }
};

class Engine {
 public:
  /// Starts the engine thread. `target`, `tokenizer` and `drafter` (null:
  /// plain decoding) must outlive the engine. Ends the calling thread's
  /// OpenMP workers (ops::release_worker_threads), so that the engine's
  /// team is the only one while the calling thread does no more parallel
  /// work. Throws InvalidArgument when opts.parallel < 1.
  Engine(TargetModel& target, const tok::Tokenizer& tokenizer, const DraftModel* drafter,
         EngineOptions opts);
  /// Calls shutdown().
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Queues a generation of `prompt` under `opts` (opts.on_token must be
  /// empty; stop_ids are end-of-generation ids) that ends at the first of
  /// `stop` strings found in its text, or at `deadline` (then
  /// FinishReason::Deadline, with the text so far). Throws InvalidArgument
  /// for invalid sampling parameters or a prompt that is empty or does not
  /// fit opts.ctx_size, QueueFull when EngineOptions::max_queue requests
  /// already wait, and Error once shutdown() has begun.
  std::shared_ptr<Request> submit(std::vector<TokenId> prompt, GenerateOptions opts,
                                  std::vector<std::string> stop,
                                  std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt);

  /// One prompt of submit_all().
  struct Submission {
    std::vector<TokenId> prompt;
    GenerateOptions opts;
  };
  /// Queues every submission, or none (a request with several prompts, as
  /// /v1/completions takes them): as submit(), and InvalidArgument when
  /// there are more than parallel + max_queue of them (they could never all
  /// be taken), QueueFull when they do not all fit now.
  std::vector<std::shared_ptr<Request>> submit_all(
      std::vector<Submission> subs, const std::vector<std::string>& stop,
      std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt);

  /// Stops accepting requests, cancels queued and active ones (they end with
  /// FinishReason::Cancelled) and joins the engine thread. Idempotent.
  void shutdown();

  /// A snapshot of the engine's occupancy.
  EngineLoad load() const;
  /// A snapshot of the engine's counters (dspark/serve/metrics.hpp).
  EngineMetrics metrics() const;
  /// Whether requests are decoded speculatively (a drafter or lookup drafts).
  bool speculative() const;

  /// The drafter in use (null: plain decoding).
  const DraftModel* drafter() const { return drafter_; }

 private:
  struct Slot;
  /// The engine thread: admit, step, retire, until shutdown.
  void run();
  /// One step of the runner over the active requests.
  void step(std::vector<std::unique_ptr<Slot>>& active);
  /// Delivers the last text and the outcome of an ended request.
  void finish(Slot& slot);
  /// Ends a request with FinishReason::Error.
  void fail(Slot& slot, const std::string& message);
  /// Moves queued requests into free slots; ends those whose deadline passed
  /// while they waited. Called with mu_ held; returns the expired ones.
  std::vector<std::unique_ptr<Slot>> admit(std::vector<std::unique_ptr<Slot>>& active);
  /// Adds what the slots did in the last step to metrics_.
  void record_step(std::vector<std::unique_ptr<Slot>>& active);

  TargetModel& target_;
  const tok::Tokenizer& tokenizer_;
  const DraftModel* drafter_;
  EngineOptions opts_;
  std::unique_ptr<BatchRunner> runner_;  // used by the engine thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Slot>> queue_;
  bool stopping_ = false;
  EngineLoad load_;
  mutable std::mutex metrics_mu_;
  EngineMetrics metrics_;
  std::mutex join_mu_;  // serializes joining thread_
  std::thread thread_;
};

}  // namespace dspark::serve
