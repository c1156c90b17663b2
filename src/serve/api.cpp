// OpenAI request parsing and response building; see include/dspark/serve/api.hpp.
#include "dspark/serve/api.hpp"

#include <cmath>
#include <limits>

#include "dspark/serve/request_checks.hpp"

namespace dspark::serve {

namespace {

using nlohmann::json;

// The field `key` of `j`, or null when absent or null.
const json* field(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

[[noreturn]] void wrong_type(const char* key, const char* expected, const json& v) {
  throw RequestError(std::string("'") + key + "' must be " + expected + ", got " + v.type_name(), key);
}

std::optional<int64_t> get_int(const json& j, const char* key) {
  const json* v = field(j, key);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    return u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
               ? std::numeric_limits<int64_t>::max()
               : static_cast<int64_t>(u);
  }
  if (v->is_number_integer()) return v->get<int64_t>();
  // 16.0 is an integer written as a float; 16.5 is not.
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
  }
  wrong_type(key, "an integer", *v);
}

std::optional<double> get_number(const json& j, const char* key) {
  const json* v = field(j, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(key, "a number", *v);
  return v->get<double>();
}

std::optional<bool> get_bool(const json& j, const char* key) {
  const json* v = field(j, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(key, "a boolean", *v);
  return v->get<bool>();
}

// Runs a shared check (request_checks.hpp), reporting its InvalidArgument as
// a RequestError for `param`.
template <typename F>
auto checked(const char* param, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const RequestError&) {
    throw;
  } catch (const InvalidArgument& e) {
    throw RequestError(e.what(), param);
  }
}

// The decimal text of an integer-valued JSON number (a seed beyond 2^64
// arrives as a float and keeps its written value, so the check refuses it).
std::string integer_text(const json& v, const char* key) {
  if (v.is_number_unsigned()) return std::to_string(v.get<uint64_t>());
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return std::to_string(static_cast<int64_t>(d));
    return v.dump();
  }
  wrong_type(key, "an integer", v);
}

std::string num(double x) {
  json j = x;
  return j.dump();
}

std::vector<tok::ChatMessage> parse_messages(const json& j) {
  const json* v = field(j, "messages");
  if (!v) throw RequestError("'messages' is required", "messages");
  if (!v->is_array()) wrong_type("messages", "an array", *v);
  if (v->empty()) throw RequestError("'messages' must contain at least one message", "messages");
  std::vector<tok::ChatMessage> out;
  for (size_t i = 0; i < v->size(); ++i) {
    const json& m = (*v)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object())
      throw RequestError("'" + where + "' must be an object, got " + m.type_name(), "messages");
    const json* role = field(m, "role");
    if (!role || !role->is_string())
      throw RequestError("'" + where + ".role' must be a string", "messages");
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "user" && r != "assistant")
      throw RequestError("'" + where + ".role' must be one of system, user, assistant; got '" + r + "'",
                         "messages");
    const json* content = field(m, "content");
    if (!content || !content->is_string())
      throw RequestError("'" + where + ".content' must be a string, got " +
                             (content ? content->type_name() : "null"),
                         "messages");
    out.push_back({r, content->get<std::string>()});
  }
  return out;
}

std::vector<std::string> parse_stop(const json& j) {
  const json* v = field(j, "stop");
  if (!v) return {};
  std::vector<std::string> out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (const json& s : *v) {
      if (!s.is_string()) throw RequestError("'stop' must be a string or an array of strings", "stop");
      out.push_back(s.get<std::string>());
    }
  } else {
    wrong_type("stop", "a string or an array of strings", *v);
  }
  return checked("stop", [&] { return stop_strings(std::move(out), "stop"); });
}

}  // namespace

ApiRequest parse_request(std::string_view body, Endpoint endpoint, const SamplingParams& defaults) {
  json j;
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {  // syntax errors, and numbers beyond double range (1e400)
    throw RequestError(std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw RequestError(std::string("the request body must be a JSON object, got ") + j.type_name());

  ApiRequest r;
  r.endpoint = endpoint;
  r.sampling = defaults;
  if (const json* m = field(j, "model"); m && !m->is_string()) wrong_type("model", "a string", *m);

  if (endpoint == Endpoint::Completions) {
    const json* p = field(j, "prompt");
    if (!p) throw RequestError("'prompt' is required", "prompt");
    if (!p->is_string()) wrong_type("prompt", "a string", *p);
    r.prompt = p->get<std::string>();
  } else {
    r.messages = parse_messages(j);
  }

  auto max_tokens = get_int(j, "max_tokens");
  const auto max_completion_tokens = get_int(j, "max_completion_tokens");  // type-checked even when unused
  const char* max_key = "max_tokens";
  if (!max_tokens) {
    max_tokens = max_completion_tokens;
    max_key = "max_completion_tokens";
  }
  if (max_tokens && *max_tokens < 1)
    throw RequestError(std::string("'") + max_key + "' must be at least 1, got " + std::to_string(*max_tokens),
                       max_key);
  r.max_tokens = max_tokens;

  if (auto t = get_number(j, "temperature")) {
    if (!(*t >= 0) || !std::isfinite(static_cast<float>(*t)))
      throw RequestError("'temperature' must be a finite number >= 0, got " + num(*t), "temperature");
    r.sampling.temperature = static_cast<float>(*t);
  }
  if (auto p = get_number(j, "top_p")) {
    if (!(*p > 0 && *p <= 1)) throw RequestError("'top_p' must be in (0, 1], got " + num(*p), "top_p");
    r.sampling.top_p = static_cast<float>(*p);
  }
  if (auto k = get_int(j, "top_k")) r.sampling.top_k = checked("top_k", [&] { return top_k_value(*k, "top_k"); });
  if (auto p = get_number(j, "min_p")) {
    if (!(*p >= 0 && *p <= 1)) throw RequestError("'min_p' must be in [0, 1], got " + num(*p), "min_p");
    r.sampling.min_p = static_cast<float>(*p);
  }
  if (const json* s = field(j, "seed")) {
    const std::optional<uint64_t> seed = checked("seed", [&] { return seed_value(integer_text(*s, "seed"), "seed"); });
    if (seed) r.sampling.seed = *seed;
    r.seed_given = seed.has_value();
  }
  if (auto n = get_int(j, "n"); n && *n != 1)
    throw RequestError("'n' must be 1 (one choice per request), got " + std::to_string(*n), "n");
  r.stop = parse_stop(j);
  r.stream = get_bool(j, "stream").value_or(false);
  if (const json* so = field(j, "stream_options")) {
    if (!so->is_object()) wrong_type("stream_options", "an object", *so);
    r.include_usage = get_bool(*so, "include_usage").value_or(false);
  }
  return r;
}

bool malformed_content_length(std::string_view value) {
  return !value.empty() && value.find_first_not_of("0123456789") != std::string_view::npos;
}

nlohmann::json error_body(const std::string& message, const std::string& type, const std::string& param) {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", nullptr}}}};
}

const char* finish_reason_text(FinishReason r) { return r == FinishReason::Stop ? "stop" : "length"; }

nlohmann::json usage_json(const RequestOutcome& o) {
  return {{"prompt_tokens", o.prompt_tokens},
          {"completion_tokens", o.completion_tokens},
          {"total_tokens", o.prompt_tokens + o.completion_tokens}};
}

nlohmann::json spec_stats_json(const RequestOutcome& o) {
  const GenerateStats& s = o.stats;
  return {{"speculative", o.speculative},
          {"tau", s.tau()},
          {"drafted", s.drafted},
          {"accepted", s.accepted},
          {"rounds", s.rounds},
          {"lookup_rounds", s.lookup_rounds},
          {"lookup_accepted", s.lookup_accepted},
          {"target_calls", s.target_calls},
          {"acceptance_by_position", s.acceptance_by_position()},
          {"prefill_ms", s.prefill_s * 1e3},
          {"decode_ms", s.decode_s * 1e3}};
}

namespace {

json base(const ResponseMeta& meta, const char* object) {
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}

bool is_chat(const ResponseMeta& m) { return m.endpoint == Endpoint::ChatCompletions; }

// One choice of a streaming chunk.
json stream_choice(const ResponseMeta& meta, json delta_or_text, json finish) {
  json c = {{"index", 0}};
  if (is_chat(meta)) {
    c["delta"] = std::move(delta_or_text);
  } else {
    c["text"] = std::move(delta_or_text);
  }
  c["logprobs"] = nullptr;
  c["finish_reason"] = std::move(finish);
  return c;
}

json chunk_base(const ResponseMeta& meta) {
  return base(meta, is_chat(meta) ? "chat.completion.chunk" : "text_completion");
}

}  // namespace

nlohmann::json response_json(const ResponseMeta& meta, const std::string& text, const RequestOutcome& o) {
  json choice = {{"index", 0}};
  if (is_chat(meta)) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish_reason_text(o.reason);
  json j = base(meta, is_chat(meta) ? "chat.completion" : "text_completion");
  j["choices"] = json::array({choice});
  j["usage"] = usage_json(o);
  j["dspark"] = spec_stats_json(o);
  return j;
}

nlohmann::json chunk_json(const ResponseMeta& meta, const std::string& text) {
  json j = chunk_base(meta);
  j["choices"] = json::array(
      {stream_choice(meta, is_chat(meta) ? json{{"content", text}} : json(text), nullptr)});
  return j;
}

nlohmann::json role_chunk_json(const ResponseMeta& meta) {
  json j = chunk_base(meta);
  j["choices"] = json::array({stream_choice(meta, json{{"role", "assistant"}, {"content", ""}}, nullptr)});
  return j;
}

nlohmann::json final_chunk_json(const ResponseMeta& meta, const RequestOutcome& o) {
  json j = chunk_base(meta);
  j["choices"] = json::array(
      {stream_choice(meta, is_chat(meta) ? json::object() : json(""), finish_reason_text(o.reason))});
  j["usage"] = usage_json(o);
  j["dspark"] = spec_stats_json(o);
  return j;
}

nlohmann::json usage_chunk_json(const ResponseMeta& meta, const RequestOutcome& o) {
  json j = chunk_base(meta);
  j["choices"] = json::array();
  j["usage"] = usage_json(o);
  return j;
}

std::string sse_event(const nlohmann::json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace dspark::serve
