// Request parameter checks shared by the front ends; see
// include/dspark/serve/request_checks.hpp.
#include "dspark/serve/request_checks.hpp"

#include <charconv>
#include <limits>
#include <random>

#include "dspark/error.hpp"

namespace dspark::serve {

namespace {
std::string prefix(std::string_view name) { return std::string(name) + ": "; }
}  // namespace

int top_k_value(int64_t k, std::string_view name) {
  if (k < -1)
    throw InvalidArgument(prefix(name) + "expected -1 or 0 (disabled) or a positive integer, got " +
                          std::to_string(k));
  if (k <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(k, std::numeric_limits<int>::max()));
}

std::optional<uint64_t> seed_value(std::string_view decimal, std::string_view name) {
  const std::string err = prefix(name) + "expected -1 (a random seed) or an integer in [0, 2^64), got '" +
                          std::string(decimal) + "'";
  if (decimal == "-1") return std::nullopt;
  if (decimal.empty() || decimal.find_first_not_of("0123456789") != std::string_view::npos)
    throw InvalidArgument(err);
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(decimal.data(), decimal.data() + decimal.size(), v);
  if (ec != std::errc() || end != decimal.data() + decimal.size()) throw InvalidArgument(err);
  return v;
}

uint64_t random_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

std::vector<std::string> stop_strings(std::vector<std::string> stop, std::string_view name) {
  if (stop.size() > kMaxStopStrings)
    throw InvalidArgument(prefix(name) + "expected at most " + std::to_string(kMaxStopStrings) +
                          " stop strings, got " + std::to_string(stop.size()));
  std::erase_if(stop, [](const std::string& s) { return s.empty(); });
  return stop;
}

void check_prompt_length(int64_t prompt_tokens, int64_t ctx, std::string_view name) {
  if (prompt_tokens <= 0) throw InvalidArgument(prefix(name) + "the prompt is empty (expected at least one token)");
  if (prompt_tokens >= ctx)
    throw InvalidArgument(prefix(name) + "the prompt has " + std::to_string(prompt_tokens) +
                          " tokens; the context holds " + std::to_string(ctx) +
                          " (prompt and at least one generated token must fit)");
}

void check_max_tokens(int64_t max_tokens, int64_t prompt_tokens, int64_t ctx, std::string_view name) {
  if (max_tokens < 1)
    throw InvalidArgument(prefix(name) + "expected a positive integer, got " + std::to_string(max_tokens));
  if (max_tokens > ctx - prompt_tokens)  // ctx - prompt_tokens >= 1 after check_prompt_length: no overflow
    throw InvalidArgument(prefix(name) + "prompt (" + std::to_string(prompt_tokens) +
                          (prompt_tokens == 1 ? " token" : " tokens") + ") + max_tokens (" +
                          // a request's integer past int64 arrives held at the limit
                          (max_tokens == std::numeric_limits<int64_t>::max() ? std::to_string(max_tokens) + " or more"
                                                                              : std::to_string(max_tokens)) +
                          ") exceeds the context length (" + std::to_string(ctx) + ")");
}

}  // namespace dspark::serve
