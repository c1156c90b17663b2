// Fuzz target: what the server makes of a request before the engine sees
// it. The first byte picks the endpoint; up to the first newline is the
// Content-Length header value, the rest the JSON body. parse_request either
// returns a validated request or throws RequestError; a request it accepts
// renders every response shape.
#include <cstdlib>

#include "dspark/serve/api.hpp"
#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dspark;
  using namespace dspark::serve;
  if (size == 0) return 0;
  const Endpoint endpoint = data[0] % 2 ? Endpoint::ChatCompletions : Endpoint::Completions;
  const std::string_view rest = fuzz::as_text(data + 1, size - 1);
  const size_t nl = rest.find('\n');
  const std::string_view length = nl == std::string_view::npos ? std::string_view{} : rest.substr(0, nl);
  const std::string_view body = nl == std::string_view::npos ? rest : rest.substr(nl + 1);
  const bool bad_length = malformed_content_length(length);
  if (!length.empty() && length.find_first_not_of("0123456789") == std::string_view::npos && bad_length) std::abort();
  try {
    const ApiRequest r = parse_request(body, endpoint, SamplingParams{});
    r.sampling.validate();
    if (r.max_tokens && *r.max_tokens < 0) std::abort();
    ResponseMeta meta;
    meta.endpoint = r.endpoint;
    // Request text echoed into responses: the dumps must survive any bytes.
    const std::string text = r.prompts.empty() || r.prompts[0].empty() ? std::string() : r.prompts[0][0].text;
    if (r.endpoint == Endpoint::Completions && r.prompts.empty()) std::abort();
    (void)response_json(meta, text, RequestOutcome{}).dump();
    (void)sse_event(chunk_json(meta, text));
  } catch (const InvalidArgument&) {  // RequestError, or validate()
  }
  return 0;
}
