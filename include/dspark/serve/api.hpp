// dspark/serve/api.hpp — the OpenAI-compatible request and response formats
// of `dspark serve`: parsing and validating request bodies, and building
// response objects and streaming chunks. Pure functions; no I/O.
//
// Request fields (others are ignored): model (string, not checked), prompt
// (completions: a string, an array of strings — one choice each —, an array
// of token ids, an array of such arrays, or a mixed array of ids and
// strings, as llama.cpp's server takes), messages (chat: non-empty array of
// {role: system | user | assistant, content: a string or an array of
// {type: "text", text} parts, joined with "\n"; other part types are
// refused}), logprobs (completions: integer 0..20, the alternatives per
// token; chat: boolean, with top_logprobs 0..20), deadline_ms (integer >= 1:
// the request ends that long after it arrived — unanswered with 503 if it is
// still queued, else with its text so far), max_tokens (alias
// max_completion_tokens; integer >= 1), temperature (number >= 0; 0 =
// greedy), top_p (number in (0, 1]), top_k (integer >= -1; 0 or -1 =
// disabled), min_p (number in [0, 1]), seed (integer), stop (string or array
// of strings), stream (boolean), stream_options.include_usage (boolean),
// n (must be 1). A null value counts as absent.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/serve/outcome.hpp"
#include "dspark/speculative/sampling.hpp"
#include "dspark/tokenizer/chat_template.hpp"

namespace dspark::serve {

/// A bad request: reported as HTTP 400 with error_body(what(),
/// "invalid_request_error", param()).
class RequestError : public InvalidArgument {
 public:
  /// `param`: the offending request field ("" when the body as a whole is bad).
  RequestError(const std::string& message, std::string param = {})
      : InvalidArgument(message), param_(std::move(param)) {}
  /// The offending field, or "".
  const std::string& param() const { return param_; }

 private:
  std::string param_;
};

/// Which OpenAI endpoint a request came to.
enum class Endpoint { Completions, ChatCompletions };

/// A piece of a completions prompt: text to tokenize, or token ids as given.
struct PromptPiece {
  std::string text;
  std::vector<TokenId> ids;
  bool is_text = true;
};
/// One completions prompt, its pieces in order.
using PromptInput = std::vector<PromptPiece>;
/// The most prompts one completions request may carry.
inline constexpr size_t kMaxPrompts = 64;

/// A validated request.
struct ApiRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::vector<PromptInput> prompts;         // completions: one choice per prompt
  std::vector<tok::ChatMessage> messages;   // chat completions
  std::optional<int64_t> max_tokens;        // absent: the server's default
  SamplingParams sampling;                  // request values over the server's defaults
  bool seed_given = false;                  // the request set a seed
  std::vector<std::string> stop;            // non-empty stop strings
  bool stream = false;
  bool include_usage = false;               // stream_options.include_usage
  int top_logprobs = -1;                    // -1: no logprobs; else alternatives per token
  std::optional<int64_t> deadline_ms;       // "deadline_ms": end by then (ms after arrival); absent: the server's
};

/// Parses and validates a request body for `endpoint`; fields the request
/// omits take their values from `defaults`. Throws RequestError naming the
/// field for malformed JSON (param ""), a body that is not an object, a
/// field of the wrong type, or a value out of range.
ApiRequest parse_request(std::string_view body, Endpoint endpoint, const SamplingParams& defaults);

/// True when a Content-Length header value is present but not a
/// non-negative decimal integer (e.g. "-5", "12abc"): a malformed request.
bool malformed_content_length(std::string_view value);

/// {"error": {"message", "type", "param", "code": null}}; param is null when
/// empty.
nlohmann::json error_body(const std::string& message, const std::string& type,
                          const std::string& param = {});

/// Identity shared by a response and all of its streaming chunks.
struct ResponseMeta {
  Endpoint endpoint = Endpoint::Completions;
  std::string id;       // "cmpl-…" or "chatcmpl-…"
  int64_t created = 0;  // Unix time, seconds
  std::string model;    // served model name
};

/// "stop" for FinishReason::Stop, "length" otherwise (responses are only
/// built for requests that ended with Stop or Length).
const char* finish_reason_text(FinishReason r);

/// {"prompt_tokens", "completion_tokens", "total_tokens"}.
nlohmann::json usage_json(const RequestOutcome& o);

/// The "dspark" object: speculative-decoding figures of one request (tau,
/// drafted, accepted, rounds, target_calls, acceptance_by_position,
/// prefill_ms, decode_ms, speculative).
nlohmann::json spec_stats_json(const RequestOutcome& o);

/// The "logprobs" value of a choice or a chunk holding `entries`, in
/// OpenAI's shapes — chat: {"content": [{token, logprob, bytes,
/// top_logprobs: [{token, logprob, bytes}]}], "refusal": null}; completions:
/// {tokens, token_logprobs, top_logprobs: [{token: logprob}] (null entries
/// when no alternatives were asked for), text_offset}. Tokens are their
/// bytes as UTF-8 (a part of a character shows as U+FFFD; chat's "bytes" has
/// the exact bytes). `text_offset`: characters of the completion before the
/// first entry; advanced past the entries (streams keep it across chunks).
nlohmann::json logprobs_json(Endpoint endpoint, const std::vector<TokenLogprob>& entries, int64_t& text_offset);

/// One choice of a complete response.
struct Choice {
  std::string text;
  RequestOutcome outcome;
  nlohmann::json logprobs;  // logprobs_json(), or null when none were asked for
};

/// Several choices' outcomes as one, for usage and the "dspark" figures of a
/// response with several prompts: token counts and speculative counts
/// added, times summed.
RequestOutcome combined(const std::vector<RequestOutcome>& outcomes);

/// A complete non-streaming response: "text_completion" with choices[i].text,
/// or "chat.completion" with choices[i].message {role: assistant, content};
/// each with its index, logprobs and finish_reason; plus usage and dspark
/// (of all choices together, combined()).
nlohmann::json response_json(const ResponseMeta& meta, const std::vector<Choice>& choices);
/// The same for one choice without logprobs.
nlohmann::json response_json(const ResponseMeta& meta, const std::string& text, const RequestOutcome& o);

/// A streaming chunk carrying `text` (chat: delta.content; completions:
/// text) and `logprobs` (logprobs_json() or null) for choice `index`, with
/// finish_reason null.
nlohmann::json chunk_json(const ResponseMeta& meta, const std::string& text, nlohmann::json logprobs = nullptr,
                          int index = 0);

/// The first chunk of a chat stream: delta {role: assistant, content: ""}.
nlohmann::json role_chunk_json(const ResponseMeta& meta);

/// The last content chunk of choice `index`: empty delta / text,
/// finish_reason, and the choice's usage and dspark.
nlohmann::json final_chunk_json(const ResponseMeta& meta, const RequestOutcome& o, int index = 0);

/// The stream_options.include_usage chunk: empty choices plus usage.
nlohmann::json usage_chunk_json(const ResponseMeta& meta, const RequestOutcome& o);

/// One server-sent event: "data: <json>\n\n" (invalid UTF-8 replaced).
std::string sse_event(const nlohmann::json& j);

}  // namespace dspark::serve
