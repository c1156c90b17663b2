// dspark/serve/request_checks.hpp — the checks of a generation request's
// parameters, shared by every front end: `dspark generate` (options), the
// server (JSON fields, api.hpp) and the Python package (keyword arguments),
// so that one value is accepted or refused, and means the same, everywhere.
//
// Each function names the parameter as the caller spells it (`name`: "--top-k",
// "top_k", ...) and throws dspark::InvalidArgument with a message of the form
// "<name>: expected ..., got ...". Sampling ranges (temperature, top_p,
// min_p) are SamplingParams::validate()'s.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dspark::serve {

/// The most stop strings one request may give (OpenAI allows 4; llama.cpp's
/// server has no limit).
inline constexpr size_t kMaxStopStrings = 16;

/// top-k as clients give it: -1 and 0 both disable it (returns 0); k >= 1 is
/// kept (capped at INT_MAX, which keeps every token). Throws for k < -1.
int top_k_value(int64_t k, std::string_view name);

/// A seed written as a decimal integer (an option value, a JSON number's
/// text, a Python int's str()): "-1" gives std::nullopt (a random seed), an
/// integer in [0, 2^64) that seed. Throws for anything else — in particular
/// 2^64 and beyond, which must not wrap to a small seed.
std::optional<uint64_t> seed_value(std::string_view decimal, std::string_view name);

/// A seed from std::random_device: what -1 asks for.
uint64_t random_seed();

/// Stop strings: at most kMaxStopStrings; empty strings are dropped (they
/// would match at once). Throws for a longer list.
std::vector<std::string> stop_strings(std::vector<std::string> stop, std::string_view name);

/// A prompt of `prompt_tokens` in a context of `ctx` tokens: at least one
/// token, and room for at least one generated token. Throws otherwise.
void check_prompt_length(int64_t prompt_tokens, int64_t ctx, std::string_view name);

/// max_tokens of a request: >= 1, and prompt_tokens + max_tokens <= ctx
/// (computed without overflow for any int64 value). Throws otherwise.
void check_max_tokens(int64_t max_tokens, int64_t prompt_tokens, int64_t ctx, std::string_view name);

}  // namespace dspark::serve
