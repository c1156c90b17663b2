// The server-sent events of one streaming response: the chunks of one or
// more requests' choices, produced on demand by the HTTP library's content
// provider (server.cpp). Pure: no socket, no HTTP library.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dspark/serve/api.hpp"
#include "dspark/serve/engine.hpp"

namespace dspark::serve {

class SseStream {
 public:
  /// How long next_events() waits for output before it returns a keep-alive
  /// comment (which also reveals a client that went away).
  static constexpr std::chrono::milliseconds kKeepAlive{2000};

  /// The choices of `requests` in order (choice i carries index i);
  /// `logprobs`: chunks carry logprobs_json(); `include_usage`: a usage chunk
  /// before [DONE].
  SseStream(std::vector<std::shared_ptr<Request>> requests, ResponseMeta meta, bool include_usage, bool logprobs);

  /// The next events: what the choices produced (waiting up to kKeepAlive
  /// for something), or ": keep-alive". A choice that ended with stop,
  /// length or a deadline after it started gets its final chunk; one that
  /// failed, was cancelled or expired in the queue ends the stream with an
  /// error event and cancels the others. After the last choice: the usage
  /// chunk (when asked for) and "data: [DONE]", and done() becomes true.
  std::string next_events();
  bool done() const { return done_; }
  /// Cancels every request (the client went away).
  void cancel();

 private:
  struct Choice {
    std::shared_ptr<Request> req;
    bool ended = false;
    int64_t text_offset = 0;  // characters sent, for completions logprobs
  };
  std::vector<Choice> choices_;
  ResponseMeta meta_;
  bool include_usage_ = false;
  bool logprobs_ = false;
  bool started_ = false;
  bool done_ = false;
  std::vector<RequestOutcome> outcomes_;
};

/// True when a request that ended this way has an answer to give (HTTP 200,
/// or a final chunk): stop, length, or a deadline that passed after it got a
/// slot (its text so far, finish_reason "length").
bool answered(const RequestOutcome& o);

}  // namespace dspark::serve
