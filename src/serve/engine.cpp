// Continuous batching of speculative decoding; see include/dspark/serve/engine.hpp.
#include "dspark/serve/engine.hpp"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <iterator>
#include <optional>
#include <utility>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "dspark/error.hpp"
#include "dspark/ops/compute_threads.hpp"
#include "dspark/serve/stop_matcher.hpp"
#include "dspark/speculative/runner.hpp"
#include "dspark/speculative/session.hpp"

namespace dspark::serve {

const char* to_string(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
    case FinishReason::Deadline: return "deadline";
  }
  return "error";
}

// ---- Request ----------------------------------------------------------------

bool Request::poll(std::string& text, std::chrono::milliseconds timeout, std::vector<TokenLogprob>* logprobs) {
  std::unique_lock lk(mu_);
  ++readers_;
  cv_.wait_for(lk, timeout, [&] { return !text_.empty() || !logprobs_.empty() || ended_; });
  --readers_;
  text += text_;
  text_.clear();
  if (logprobs) std::move(logprobs_.begin(), logprobs_.end(), std::back_inserter(*logprobs));
  logprobs_.clear();
  return ended_;
}

bool Request::unread_since(Clock::time_point now, std::chrono::milliseconds timeout) {
  std::lock_guard lk(mu_);
  return readers_ == 0 && (!text_.empty() || !logprobs_.empty()) && now - pending_since_ > timeout;
}

std::string Request::wait() {
  std::unique_lock lk(mu_);
  ++readers_;
  cv_.wait(lk, [&] { return ended_; });
  --readers_;
  std::string out;
  out.swap(text_);
  return out;
}

void Request::deliver(std::string_view text, TokenLogprob* logprob) {
  {
    std::lock_guard lk(mu_);
    if (text_.empty() && logprobs_.empty()) pending_since_ = Clock::now();
    text_.append(text);
    if (logprob) logprobs_.push_back(std::move(*logprob));
  }
  cv_.notify_all();
}

void Request::complete(std::string_view tail, RequestOutcome outcome) {
  {
    std::lock_guard lk(mu_);
    text_.append(tail);
    outcome_ = std::move(outcome);
    ended_ = true;
  }
  cv_.notify_all();
}

// ---- Engine -----------------------------------------------------------------

// A request inside the engine: its session and the text pipeline
// (token → UTF-8 → stop strings → Request). Owned by the engine; the
// session's token callback points back at it, so a Slot never moves.
struct Engine::Slot {
  std::shared_ptr<Request> req = std::make_shared<Request>();
  std::optional<SpecSession> session;
  tok::StreamDecoder decoder;
  StopMatcher matcher;
  int64_t prompt_len = 0;
  bool failed = false;
  bool shut_down = false;    // cancelled because the engine is stopping
  bool unread = false;       // cancelled because its text was not taken (EngineOptions::unread_timeout)
  std::string error;

  bool logprobs = false;      // the request asked for log-probabilities
  bool expired = false;       // its deadline passed
  bool admitted = false;      // it got a slot
  const tok::Tokenizer& tokenizer;
  // Timing, for the metrics: arrival, deadline, the last token; and what
  // the session has emitted or verified since the metrics last looked.
  using Clock = std::chrono::steady_clock;
  Clock::time_point submitted = Clock::now();
  std::optional<Clock::time_point> deadline;
  std::optional<Clock::time_point> last_token;
  std::optional<double> ttft;              // seconds, set by the first token
  std::vector<double> token_intervals;     // seconds between later tokens
  int64_t seen_rounds = 0, seen_drafted = 0;

  Slot(const tok::Tokenizer& t, std::vector<std::string> stop)
      : decoder(t), matcher(std::move(stop)), tokenizer(t) {}

  // The session's log-probabilities of a token, with tokens as bytes.
  TokenLogprob api_logprob(const TokenLogprobs& t) const {
    TokenLogprob out{tokenizer.token_bytes(t.id), t.logprob, {}};
    for (size_t i = 0; i < t.top_ids.size(); ++i)
      out.top.emplace_back(tokenizer.token_bytes(t.top_ids[i]), t.top_logprobs[i]);
    return out;
  }

  // Called by the session for every emitted token; false ends generation.
  bool on_token(TokenId id) {
    const auto now = Clock::now();
    if (last_token) token_intervals.push_back(std::chrono::duration<double>(now - *last_token).count());
    else ttft = std::chrono::duration<double>(now - submitted).count();
    last_token = now;
    try {
      const std::string out = matcher.push(decoder.push(id));
      if (logprobs) {
        TokenLogprob lp = api_logprob(session->result().logprobs.back());
        req->deliver(out, &lp);
      } else if (!out.empty()) {
        req->deliver(out);
      }
      return !matcher.matched();
    } catch (const std::exception& e) {
      failed = true;
      error = e.what();
      return false;
    }
  }
};

Engine::Engine(TargetModel& target, const tok::Tokenizer& tokenizer, const DraftModel* drafter,
               EngineOptions opts)
    : target_(target), tokenizer_(tokenizer), drafter_(drafter), opts_(std::move(opts)) {
  if (opts_.parallel < 1)
    throw InvalidArgument("parallel must be >= 1, got " + std::to_string(opts_.parallel));
  if (opts_.prefill_budget < 0)
    throw InvalidArgument("prefill budget must be >= 0, got " + std::to_string(opts_.prefill_budget));
  // Verify lengths are chosen across requests by the runner's policy.
  SpecOptions policy = opts_.spec;
  policy.sps = drafter_ || opts_.spec.lookup.enabled() ? opts_.sps : std::vector<double>{};
  // Each session's drafter-skip rule prices rounds on the same curve.
  opts_.spec.sps = policy.sps;
  if (!(opts_.prefill_slowdown >= 0))
    throw InvalidArgument("prefill slowdown must be >= 0, got " + std::to_string(opts_.prefill_slowdown));
  runner_ = std::make_unique<BatchRunner>(target_, drafter_, policy,
                                          RunnerOptions{opts_.prefill_budget, opts_.sps, opts_.prefill_slowdown});
  if (opts_.max_queue < 0) throw InvalidArgument("max_queue must be >= 0, got " + std::to_string(opts_.max_queue));
  load_.parallel = opts_.parallel;
  load_.max_queue = opts_.max_queue;
  // The engine thread is to be the only thread with OpenMP workers
  // (ops/compute_threads.hpp: beside a second team a step took ~4x as long).
  ops::release_worker_threads();
  thread_ = std::thread([this] { run(); });
}

Engine::~Engine() { shutdown(); }

std::shared_ptr<Request> Engine::submit(std::vector<TokenId> prompt, GenerateOptions opts,
                                        std::vector<std::string> stop,
                                        std::optional<std::chrono::steady_clock::time_point> deadline) {
  std::vector<Submission> one;
  one.push_back({std::move(prompt), std::move(opts)});
  return submit_all(std::move(one), stop, deadline).front();
}

std::vector<std::shared_ptr<Request>> Engine::submit_all(
    std::vector<Submission> subs, const std::vector<std::string>& stop,
    std::optional<std::chrono::steady_clock::time_point> deadline) {
  const int n = static_cast<int>(subs.size());
  if (n == 0) throw InvalidArgument("submit_all: no prompts");
  if (opts_.max_queue > 0 && n > opts_.parallel + opts_.max_queue)
    throw InvalidArgument("the request holds " + std::to_string(n) + " prompts, but this server takes at most " +
                          std::to_string(opts_.parallel + opts_.max_queue) + " at once (--parallel " +
                          std::to_string(opts_.parallel) + " + --max-queue " + std::to_string(opts_.max_queue) + ")");
  std::vector<std::unique_ptr<Slot>> slots;
  std::vector<std::shared_ptr<Request>> reqs;
  for (Submission& sub : subs) {
    if (sub.opts.on_token) throw InvalidArgument("submit: on_token must be empty");
    auto slot = std::make_unique<Slot>(tokenizer_, stop);
    slot->deadline = deadline;
    Slot* s = slot.get();
    sub.opts.on_token = [s](TokenId id) { return s->on_token(id); };
    slot->prompt_len = static_cast<int64_t>(sub.prompt.size());
    slot->logprobs = sub.opts.top_logprobs >= 0;
    slot->session.emplace(target_, drafter_, std::move(sub.prompt), std::move(sub.opts), opts_.spec);
    reqs.push_back(slot->req);
    slots.push_back(std::move(slot));
  }
  {
    std::lock_guard lk(mu_);
    if (stopping_) throw Error("the server is shutting down");
    load_.queued = static_cast<int>(queue_.size());
    EngineLoad after = load_;
    after.queued += n;
    if (opts_.max_queue > 0 && after.waiting() > opts_.max_queue) {
      if (n == 1)
        throw QueueFull(std::to_string(load_.waiting()) + " requests already wait for one of the " +
                        std::to_string(opts_.parallel) + " slots (the limit is " + std::to_string(opts_.max_queue) +
                        "); retry later");
      throw QueueFull("the request's " + std::to_string(n) + " prompts do not all fit now: " +
                      std::to_string(load_.waiting()) + " requests already wait for one of the " +
                      std::to_string(opts_.parallel) + " slots, " + std::to_string(load_.active) +
                      " run (the limit is " + std::to_string(opts_.max_queue) + " waiting); retry later");
    }
    for (auto& slot : slots) queue_.push_back(std::move(slot));
    load_.queued = static_cast<int>(queue_.size());
  }
  cv_.notify_all();
  return reqs;
}

void Engine::shutdown() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  std::lock_guard jl(join_mu_);
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

EngineLoad Engine::load() const {
  std::lock_guard lk(mu_);
  return load_;
}

EngineMetrics Engine::metrics() const {
  std::lock_guard lk(metrics_mu_);
  EngineMetrics m = metrics_;
  m.steps = load().steps;
  return m;
}

bool Engine::speculative() const { return drafter_ != nullptr || opts_.spec.lookup.enabled(); }

std::vector<std::unique_ptr<Engine::Slot>> Engine::admit(std::vector<std::unique_ptr<Slot>>& active) {
  std::vector<std::unique_ptr<Slot>> gone;
  const auto now = std::chrono::steady_clock::now();
  // Requests whose client left or whose deadline passed never take a slot.
  for (auto& s : queue_) {
    if (s->deadline && now >= *s->deadline) s->expired = true;
    if (s->expired || s->req->cancel_requested()) {
      s->session->cancel();
      gone.push_back(std::move(s));
    }
  }
  std::erase(queue_, nullptr);
  std::vector<double> waited;
  while (static_cast<int>(active.size()) < opts_.parallel && !queue_.empty()) {
    Slot& s = *queue_.front();
    s.admitted = true;
    waited.push_back(std::chrono::duration<double>(now - s.submitted).count());
    active.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  std::lock_guard lk(metrics_mu_);
  for (double w : waited) metrics_.queue_time.observe(w);
  return gone;
}

void Engine::record_step(std::vector<std::unique_ptr<Slot>>& active) {
  std::lock_guard lk(metrics_mu_);
  EngineMetrics& m = metrics_;
  for (auto& s : active) {
    if (s->ttft) {
      m.time_to_first_token.observe(*s->ttft);
      m.prompt_tokens += s->prompt_len;
      ++m.generated_tokens;
      s->ttft.reset();
    }
    for (double dt : s->token_intervals) m.time_per_output_token.observe(dt);
    m.generated_tokens += static_cast<int64_t>(s->token_intervals.size());
    s->token_intervals.clear();
    // One round per step: the drafted length it verified.
    const GenerateStats& st = s->session->result().stats;
    if (st.rounds == s->seen_rounds + 1) m.verify_length.observe(static_cast<double>(st.drafted - s->seen_drafted));
    s->seen_rounds = st.rounds;
    s->seen_drafted = st.drafted;
  }
}

void Engine::run() {
  std::vector<std::unique_ptr<Slot>> active, expired;
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty() || !active.empty(); });
      if (stopping_) break;
      expired = admit(active);
      load_.active = static_cast<int>(active.size());
      load_.queued = static_cast<int>(queue_.size());
      load_.completed += static_cast<int64_t>(expired.size());
    }
    for (auto& s : expired) finish(*s);
    expired.clear();
    try {
      step(active);
    } catch (const std::exception& e) {
      // Not expected (step isolates per-request failures); never let the
      // engine thread die: fail what was running.
      for (auto& s : active)
        if (!s->session->finished()) fail(*s, std::string("internal error: ") + e.what());
    }
    record_step(active);
    std::vector<std::unique_ptr<Slot>> ended;
    for (auto& s : active)
      if (s->session->finished() || s->failed) ended.push_back(std::move(s));
    std::erase(active, nullptr);
    {
      // Counters first: a client that sees its request end also sees it counted.
      std::lock_guard lk(mu_);
      load_.active = static_cast<int>(active.size());
      load_.completed += static_cast<int64_t>(ended.size());
    }
    for (auto& s : ended) finish(*s);
#ifdef __GLIBC__
    // Idle: hand the freed KV caches back to the system, so a long prompt
    // does not leave the process holding its cache's memory.
    if (active.empty() && !ended.empty()) malloc_trim(0);
#endif
  }
  // Shutting down: end every request that is still here.
  std::deque<std::unique_ptr<Slot>> queued;
  {
    std::lock_guard lk(mu_);
    queued.swap(queue_);
  }
  for (auto& s : queued) active.push_back(std::move(s));
  for (auto& s : active) {
    s->shut_down = true;
    s->session->cancel();
    finish(*s);
  }
  std::lock_guard lk(mu_);
  load_.active = load_.queued = 0;
}

void Engine::step(std::vector<std::unique_ptr<Slot>>& active) {
  std::vector<SpecSession*> sessions;
  const auto now = std::chrono::steady_clock::now();
  for (auto& s : active) {
    if (s->deadline && now >= *s->deadline && !s->session->finished()) {
      s->expired = true;
      s->session->cancel();
    }
    if (opts_.unread_timeout.count() > 0 && !s->session->finished() &&
        s->req->unread_since(now, opts_.unread_timeout)) {
      s->unread = true;
      s->session->cancel();
    }
    if (s->req->cancel_requested()) s->session->cancel();
    if (!s->session->finished() && !s->failed) sessions.push_back(&*s->session);
  }
  if (sessions.empty()) return;
  const int64_t calls = runner_->calls();
  runner_->step(sessions, [&](SpecSession& failed, const std::string& message) {
    for (auto& s : active)
      if (&*s->session == &failed) fail(*s, message);
  });
  std::lock_guard lk(mu_);
  load_.steps += runner_->calls() - calls;
}

void Engine::fail(Slot& slot, const std::string& message) {
  slot.failed = true;
  slot.error = message;
  slot.session->cancel();
}

void Engine::finish(Slot& slot) {
  const GenerateResult& res = slot.session->result();
  RequestOutcome o;
  std::string tail;
  if (slot.failed) {
    o.reason = FinishReason::Error;
    o.error = slot.error;
  } else {
    // A character the last token left unfinished is dropped, not sent as U+FFFD.
    slot.decoder.finish();
    if (!slot.matcher.matched()) tail = slot.matcher.flush();
    if (slot.matcher.matched() || res.stopped_by_eog) {
      o.reason = FinishReason::Stop;
    } else if (slot.shut_down) {
      o.reason = FinishReason::Cancelled;
      o.error = "the server is shutting down";
    } else if (slot.unread) {
      o.reason = FinishReason::Cancelled;
      o.error = "cancelled: its output was not read for " + std::to_string(opts_.unread_timeout.count()) +
                " ms (an abandoned stream)";
    } else if (slot.req->cancel_requested()) {
      o.reason = FinishReason::Cancelled;
      o.error = "cancelled";
    } else if (slot.expired) {
      o.reason = FinishReason::Deadline;
      o.error = slot.admitted ? "the request's deadline passed while it was decoded"
                              : "the request's deadline passed while it waited for a slot";
    } else {
      o.reason = FinishReason::Length;
    }
  }
  o.prompt_tokens = slot.prompt_len;
  o.completion_tokens = static_cast<int64_t>(res.tokens.size());
  o.stats = res.stats;
  o.speculative = speculative();
  o.admitted = slot.admitted;
  {
    std::lock_guard lk(metrics_mu_);
    EngineMetrics& m = metrics_;
    ++m.finished[to_string(o.reason)];
    m.totals += res.stats;
  }
  slot.req->complete(tail, std::move(o));
}

}  // namespace dspark::serve
