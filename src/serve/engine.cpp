// Continuous batching of speculative decoding; see include/dspark/serve/engine.hpp.
#include "dspark/serve/engine.hpp"

#include <algorithm>
#include <exception>
#include <optional>
#include <utility>

#include "dspark/error.hpp"
#include "dspark/serve/stop_matcher.hpp"
#include "dspark/spec/calibration.hpp"
#include "dspark/spec/scheduler.hpp"
#include "dspark/spec/session.hpp"

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

bool Request::poll(std::string& text, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return !text_.empty() || ended_; });
  text += text_;
  text_.clear();
  return ended_;
}

std::string Request::wait() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return ended_; });
  std::string out;
  out.swap(text_);
  return out;
}

void Request::deliver(std::string_view text) {
  {
    std::lock_guard lk(mu_);
    text_.append(text);
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
  bool prefilled = false;    // the prompt has been through the target
  bool failed = false;
  bool shut_down = false;    // cancelled because the engine is stopping
  std::string error;

  Slot(const tok::Tokenizer& t, std::vector<std::string> stop)
      : decoder(t), matcher(std::move(stop)) {}

  // Called by the session for every emitted token; false ends generation.
  bool on_token(TokenId id) {
    try {
      const std::string out = matcher.push(decoder.push(id));
      if (!out.empty()) req->deliver(out);
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
  // Verify lengths are chosen across requests here, not per session.
  opts_.spec.sps.clear();
  if (!drafter_) opts_.sps.clear();
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
  // Under the scheduler, drafting only pays when the first candidate could
  // raise Θ for this step's decoding requests (prefill tokens shift the
  // curve); otherwise the scheduler would verify no draft at all, so the
  // drafter is skipped and the step is plain decoding for everyone.
  bool draft = true;
  if (drafter_ && !opts_.sps.empty()) {
    int64_t decoding = 0, prefill = 0;
    for (auto& s : active) {
      if (s->session->finished() || s->failed || s->req->cancel_requested()) continue;
      if (s->prefilled) ++decoding;
      else prefill += s->prompt_len;
    }
    std::vector<double> curve;
    for (int64_t b = 1; b <= decoding + 1; ++b) curve.push_back(sps_at(opts_.sps, b + prefill));
    draft = decoding > 0 && any_draft_can_pay(decoding, curve);
  }
  std::vector<Slot*> batch;
  for (auto& s : active) {
    SpecSession& ss = *s->session;
    if (s->req->cancel_requested()) ss.cancel();
    if (ss.finished() || s->failed) continue;
    try {
      if (draft) ss.draft();
      else ss.skip_draft();
      batch.push_back(s.get());
    } catch (const std::exception& e) {
      fail(*s, e.what());
    }
  }
  if (batch.empty()) return;
  plan_verify(batch);
  forward_batch(batch);
}

void Engine::plan_verify(std::vector<Slot*>& batch) {
  if (!drafter_ || opts_.sps.empty()) return;
  std::vector<Slot*> decoding;
  std::vector<std::vector<double>> survival;
  int64_t prefill_tokens = 0;
  const std::vector<double> temps = drafter_->calibrated_temperatures();
  size_t candidates = 0;
  for (Slot* s : batch) {
    if (!s->prefilled) {
      prefill_tokens += s->prompt_len;
      continue;
    }
    std::vector<double> a = calibrated_survival(s->session->conf_logits(), temps);
    a.resize(std::min<size_t>(a.size(), static_cast<size_t>(s->session->max_verify())));
    candidates += a.size();
    decoding.push_back(s);
    survival.push_back(std::move(a));
  }
  if (decoding.empty()) return;
  try {
    // The decode tokens share the call with the prefill tokens: SPS as seen
    // by them is the curve shifted by the prefill length.
    std::vector<double> curve;
    const size_t n = decoding.size() + candidates;
    curve.reserve(n);
    for (size_t b = 1; b <= n; ++b)
      curve.push_back(sps_at(opts_.sps, static_cast<int64_t>(b) + prefill_tokens));
    const ScheduleResult r = schedule_prefixes(survival, curve);
    for (size_t i = 0; i < decoding.size(); ++i) decoding[i]->session->set_verify_length(r.lengths[i]);
  } catch (const std::exception&) {
    // A degenerate survival or curve: verify everything that was drafted.
  }
}

void Engine::forward_batch(std::vector<Slot*>& batch) {
  std::vector<ForwardSeq> seqs;
  seqs.reserve(batch.size());
  TapRequest taps;
  for (Slot* s : batch) {
    seqs.push_back(s->session->forward_input());
    // Every session of one engine has the same drafter, hence the same taps.
    if (taps.layers.empty()) taps = s->session->taps();
  }
  std::vector<ForwardOut> outs;
  try {
    outs = target_.forward(std::span<ForwardSeq>(seqs), taps);
  } catch (const std::exception& e) {
    if (batch.size() == 1) {
      fail(*batch[0], e.what());
      return;
    }
    // Find the request at fault: run each on its own (a failed call leaves
    // the caches unchanged).
    for (Slot* s : batch) {
      std::vector<Slot*> one{s};
      forward_batch(one);
    }
    return;
  }
  {
    std::lock_guard lk(mu_);
    ++load_.steps;
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    try {
      batch[i]->session->consume(outs[i]);
      batch[i]->prefilled = true;
    } catch (const std::exception& e) {
      fail(*batch[i], e.what());
    }
  }
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
    if (!slot.matcher.matched()) {
      try {
        tail = slot.matcher.push(slot.decoder.flush());
      } catch (const std::exception&) {
      }
      if (!slot.matcher.matched()) tail += slot.matcher.flush();
    }
    if (slot.matcher.matched() || res.stopped_by_eog) {
      o.reason = FinishReason::Stop;
    } else if (slot.shut_down) {
      o.reason = FinishReason::Cancelled;
      o.error = "the server is shutting down";
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
  o.speculative = drafter_ != nullptr;
  slot.req->complete(tail, std::move(o));
}

}  // namespace dspark::serve
