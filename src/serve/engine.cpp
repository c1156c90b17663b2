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
  const tok::Tokenizer& tokenizer;

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
  runner_ = std::make_unique<BatchRunner>(target_, drafter_, policy, RunnerOptions{opts_.prefill_budget});
  load_.parallel = opts_.parallel;
  thread_ = std::thread([this] { run(); });
}

Engine::~Engine() { shutdown(); }

std::shared_ptr<Request> Engine::submit(std::vector<TokenId> prompt, GenerateOptions opts,
                                        std::vector<std::string> stop) {
  if (opts.on_token) throw InvalidArgument("submit: on_token must be empty");
  auto slot = std::make_unique<Slot>(tokenizer_, std::move(stop));
  Slot* s = slot.get();
  opts.on_token = [s](TokenId id) { return s->on_token(id); };
  slot->prompt_len = static_cast<int64_t>(prompt.size());
  slot->logprobs = opts.top_logprobs >= 0;
  slot->session.emplace(target_, drafter_, std::move(prompt), std::move(opts), opts_.spec);
  auto req = slot->req;
  {
    std::lock_guard lk(mu_);
    if (stopping_) throw Error("the server is shutting down");
    queue_.push_back(std::move(slot));
    load_.queued = static_cast<int>(queue_.size());
  }
  cv_.notify_all();
  return req;
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

void Engine::run() {
  std::vector<std::unique_ptr<Slot>> active;
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty() || !active.empty(); });
      if (stopping_) break;
      while (static_cast<int>(active.size()) < opts_.parallel && !queue_.empty()) {
        active.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      load_.active = static_cast<int>(active.size());
      load_.queued = static_cast<int>(queue_.size());
    }
    try {
      step(active);
    } catch (const std::exception& e) {
      // Not expected (step isolates per-request failures); never let the
      // engine thread die: fail what was running.
      for (auto& s : active)
        if (!s->session->finished()) fail(*s, std::string("internal error: ") + e.what());
    }
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
    } else {
      o.reason = FinishReason::Length;
    }
  }
  o.prompt_tokens = slot.prompt_len;
  o.completion_tokens = static_cast<int64_t>(res.tokens.size());
  o.stats = res.stats;
  o.speculative = drafter_ != nullptr || opts_.spec.lookup.enabled();
  slot.req->complete(tail, std::move(o));
}

}  // namespace dspark::serve
