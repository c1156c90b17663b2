// dspark/serve/api.hpp — the OpenAI-compatible request and response formats
// of `dspark serve`: parsing and validating request bodies, and building
// response objects and streaming chunks. Pure functions; no I/O.
//
// Request fields (others are ignored): model (string, not checked), prompt
// (completions: string), messages (chat: non-empty array of {role: system |
// user | assistant, content: string}), max_tokens (alias
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

/// A validated request.
struct ApiRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::string prompt;                       // completions
  std::vector<tok::ChatMessage> messages;   // chat completions
  std::optional<int64_t> max_tokens;        // absent: the server's default
  SamplingParams sampling;                  // request values over the server's defaults
  bool seed_given = false;                  // the request set a seed
  std::vector<std::string> stop;            // non-empty stop strings
  bool stream = false;
  bool include_usage = false;               // stream_options.include_usage
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

/// A complete non-streaming response: "text_completion" with choices[0].text,
/// or "chat.completion" with choices[0].message {role: assistant, content};
/// plus usage and dspark.
nlohmann::json response_json(const ResponseMeta& meta, const std::string& text,
                             const RequestOutcome& o);

/// A streaming chunk carrying `text` (chat: delta.content; completions:
/// text) with finish_reason null.
nlohmann::json chunk_json(const ResponseMeta& meta, const std::string& text);

/// The first chunk of a chat stream: delta {role: assistant, content: ""}.
nlohmann::json role_chunk_json(const ResponseMeta& meta);

/// The last content chunk: empty delta / text, finish_reason, usage and dspark.
nlohmann::json final_chunk_json(const ResponseMeta& meta, const RequestOutcome& o);

/// The stream_options.include_usage chunk: empty choices plus usage.
nlohmann::json usage_chunk_json(const ResponseMeta& meta, const RequestOutcome& o);

/// One server-sent event: "data: <json>\n\n" (invalid UTF-8 replaced).
std::string sse_event(const nlohmann::json& j);

}  // namespace dspark::serve
