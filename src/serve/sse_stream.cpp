// Server-sent events of a streaming response; see sse_stream.hpp.
#include "sse_stream.hpp"

#include <algorithm>

namespace dspark::serve {

namespace {
// How long a stream of several choices waits on one before looking at the next.
constexpr std::chrono::milliseconds kMultiPoll{20};
}  // namespace

bool answered(const RequestOutcome& o) {
  return o.reason == FinishReason::Stop || o.reason == FinishReason::Length ||
         (o.reason == FinishReason::Deadline && o.admitted);
}

SseStream::SseStream(std::vector<std::shared_ptr<Request>> requests, ResponseMeta meta, bool include_usage,
                     bool logprobs)
    : meta_(std::move(meta)), include_usage_(include_usage), logprobs_(logprobs) {
  for (auto& r : requests) choices_.push_back({std::move(r)});
}

void SseStream::cancel() {
  for (auto& c : choices_) c.req->cancel();
}

std::string SseStream::next_events() {
  std::string out;
  if (!started_) {
    started_ = true;
    if (meta_.endpoint == Endpoint::ChatCompletions) out += sse_event(role_chunk_json(meta_));
  }
  const bool one = choices_.size() == 1;
  const auto until = std::chrono::steady_clock::now() + kKeepAlive;
  do {
    for (size_t i = 0; i < choices_.size(); ++i) {
      Choice& c = choices_[i];
      if (c.ended) continue;
      std::string text;
      std::vector<TokenLogprob> lp;
      // One choice waits on its channel; several poll in turn.
      const auto wait = out.empty() ? (one ? kKeepAlive : kMultiPoll) : std::chrono::milliseconds(0);
      c.ended = c.req->poll(text, wait, logprobs_ ? &lp : nullptr);
      const auto index = static_cast<int>(i);
      if (!text.empty() || !lp.empty())
        out += sse_event(chunk_json(meta_, text,
                                    logprobs_ ? logprobs_json(meta_.endpoint, lp, c.text_offset) : nlohmann::json(nullptr),
                                    index));
      if (!c.ended) continue;
      const RequestOutcome& o = c.req->outcome();
      if (answered(o)) {
        out += sse_event(final_chunk_json(meta_, o, index));
        outcomes_.push_back(o);
        continue;
      }
      // A choice that failed or was cancelled ends the whole stream.
      cancel();
      out += sse_event(error_body(o.reason == FinishReason::Error ? "generation failed: " + o.error : o.error,
                                  "server_error"));
      out += "data: [DONE]\n\n";
      done_ = true;
      return out;
    }
  } while (out.empty() && std::chrono::steady_clock::now() < until);
  if (std::all_of(choices_.begin(), choices_.end(), [](const Choice& c) { return c.ended; })) {
    if (include_usage_) out += sse_event(usage_chunk_json(meta_, combined(outcomes_)));
    out += "data: [DONE]\n\n";
    done_ = true;
  }
  if (out.empty()) out = ": keep-alive\n\n";
  return out;
}

}  // namespace dspark::serve
