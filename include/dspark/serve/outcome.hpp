// dspark/serve/outcome.hpp — how a served request ended, apart from the
// engine so that the API layer (api.hpp) builds without a model.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dspark/speculative/stats.hpp"

namespace dspark::serve {

/// Why a request ended.
enum class FinishReason {
  Stop,       // an end-of-generation token or a stop string
  Length,     // max_tokens reached, or the context is full
  Cancelled,  // cancelled by the client or by shutdown
  Error,      // an exception while decoding it (message in RequestOutcome::error)
  Deadline,   // its deadline passed (queued: RequestOutcome::admitted is false)
};

/// "stop" | "length" | "cancelled" | "error" | "deadline".
const char* to_string(FinishReason r);

/// One emitted token's log-probabilities as the API reports them (the
/// target's distribution at that position, see TokenLogprobs in
/// dspark/speculative/generate.hpp), with tokens as their bytes.
struct TokenLogprob {
  std::string token;  // the token's bytes (may be part of a UTF-8 character)
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;  // the most likely tokens' bytes and log-probabilities
};

/// Everything known about a request once it has ended.
struct RequestOutcome {
  FinishReason reason = FinishReason::Length;
  std::string error;            // Error / Cancelled: what happened
  int64_t prompt_tokens = 0;
  /// Tokens consumed: every emitted token up to and including the one that
  /// completed a stop string (end-of-generation ids are not counted).
  int64_t completion_tokens = 0;
  GenerateStats stats;          // the session's figures (speculative ones when a drafter runs)
  bool speculative = false;     // a drafter proposed tokens for this request
  bool admitted = false;        // it got a decode slot (false: it ended while queued)
};

}  // namespace dspark::serve
