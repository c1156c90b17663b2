// OpenAI request parsing and response building; see include/dspark/serve/api.hpp.
#include "dspark/serve/api.hpp"

#include <algorithm>
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
  // A number of the wrong kind (5.5 for an integer) is quoted; other types are named.
  throw RequestError(std::string("'") + key + "' must be " + expected + ", got " +
                         (v.is_number() ? v.dump() : std::string(v.type_name())),
                     key);
}

// A field whose only value this server does is the empty one: absent, null
// or empty passes; another type is wrong_type (`expected`), anything else is
// refused naming the field and `why`.
void refuse_unless_empty(const json& j, const char* key, json::value_t type, const char* expected, const char* why) {
  const json* v = field(j, key);
  if (!v) return;
  if (v->type() != type) wrong_type(key, expected, *v);
  if (v->is_string() ? !v->get_ref<const std::string&>().empty() : !v->empty())
    throw RequestError(std::string("'") + key + "' is not supported: " + why, key);
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
  // 16.0 is an integer written as a float; 16.5 is not. An integer beyond
  // int64 arrives as a float too, and is held at the int64 limits as the
  // unsigned ones are (the range checks then say what the limit is).
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d)) {
      if (d >= 9.2e18) return std::numeric_limits<int64_t>::max();
      if (d <= -9.2e18) return std::numeric_limits<int64_t>::min();
      return static_cast<int64_t>(d);
    }
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

// The decimal text of an integer-valued JSON number: a float that is an
// integer in [0, 2^64) (1e19) is that integer exactly; one beyond 2^64
// keeps its written value, so the check refuses it.
std::string integer_text(const json& v, const char* key) {
  if (v.is_number_unsigned()) return std::to_string(v.get<uint64_t>());
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return std::to_string(static_cast<int64_t>(d));
    if (std::isfinite(d) && d == std::floor(d) && d > 0 && d < 18446744073709551616.0)
      return std::to_string(static_cast<uint64_t>(d));
    return v.dump();
  }
  wrong_type(key, "an integer", v);
}

std::string num(double x) {
  json j = x;
  return j.dump();
}

// Content given as parts ([{"type": "text", "text": "..."}], as current
// OpenAI clients send it): the texts joined with "\n", as vLLM joins them.
// Any other part type (image_url, input_audio, file) is refused by name.
std::string text_of_parts(const json& parts, const std::string& where) {
  std::string text;
  for (size_t i = 0; i < parts.size(); ++i) {
    const json& part = parts[i];
    const std::string at = where + ".content[" + std::to_string(i) + "]";
    if (!part.is_object())
      throw RequestError("'" + at + "' must be an object {\"type\": \"text\", \"text\": ...}, got " + part.type_name(),
                         "messages");
    const json* type = field(part, "type");
    if (!type || !type->is_string()) throw RequestError("'" + at + ".type' must be a string", "messages");
    if (type->get<std::string>() != "text")
      throw RequestError("'" + at + "': content parts of type '" + type->get<std::string>() +
                             "' are not supported: this server reads text only (parts of type 'text')",
                         "messages");
    const json* t = field(part, "text");
    if (!t || !t->is_string())
      throw RequestError("'" + at + ".text' must be a string, got " + (t ? t->type_name() : "null"), "messages");
    if (i > 0) text += '\n';
    text += t->get<std::string>();
  }
  return text;
}

// One prompt from an array of token ids and strings, in order (llama.cpp's
// server takes the same mixed form; its strings are tokenized in place).
PromptInput mixed_prompt(const json& a, const std::string& where) {
  if (a.empty()) throw RequestError("'" + where + "' must not be empty", "prompt");
  PromptInput p;
  for (size_t i = 0; i < a.size(); ++i) {
    const json& e = a[i];
    if (e.is_string()) {
      p.push_back({e.get<std::string>(), {}, true});
      continue;
    }
    const bool integer = e.is_number_integer() || e.is_number_unsigned();
    if (!integer || e.get<int64_t>() < 0 || e.get<int64_t>() > std::numeric_limits<TokenId>::max())
      throw RequestError("'" + where + "[" + std::to_string(i) + "]' must be a token id (an integer >= 0) or a string, got " +
                             e.dump(),
                         "prompt");
    if (p.empty() || p.back().is_text) p.push_back({{}, {}, false});
    p.back().ids.push_back(static_cast<TokenId>(e.get<int64_t>()));
  }
  return p;
}

// "prompt" of /v1/completions: a string; an array of strings (several
// prompts, one choice each); an array of token ids (one prompt); an array of
// such arrays (several); or a mixed array of ids and strings (one prompt).
std::vector<PromptInput> parse_prompts(const json& j) {
  const json* v = field(j, "prompt");
  if (!v)
    throw RequestError(field(j, "messages") ? "'prompt' is required (a request with 'messages' goes to /v1/chat/completions)"
                                            : "'prompt' is required",
                       "prompt");
  if (v->is_string()) return {PromptInput{{v->get<std::string>(), {}, true}}};
  if (!v->is_array())
    wrong_type("prompt", "a string, an array of strings, an array of token ids or an array of such arrays", *v);
  if (v->empty()) throw RequestError("'prompt' must not be an empty array", "prompt");
  // As llama.cpp's server reads it: numbers (with or without strings) make
  // one prompt; otherwise every element (a string or an array) is a prompt.
  const bool has_number = std::any_of(v->begin(), v->end(), [](const json& e) { return e.is_number(); });
  const bool has_array = std::any_of(v->begin(), v->end(), [](const json& e) { return e.is_array(); });
  std::vector<PromptInput> out;
  if (has_number && !has_array) {
    out.push_back(mixed_prompt(*v, "prompt"));
  } else {
    for (size_t i = 0; i < v->size(); ++i) {
      const json& e = (*v)[i];
      const std::string where = "prompt[" + std::to_string(i) + "]";
      if (e.is_string()) out.push_back({{e.get<std::string>(), {}, true}});
      else if (e.is_array()) out.push_back(mixed_prompt(e, where));
      else throw RequestError("'" + where + "' must be a string or an array of token ids, got " + e.type_name(), "prompt");
    }
  }
  if (out.size() > kMaxPrompts)
    throw RequestError("'prompt' may hold at most " + std::to_string(kMaxPrompts) + " prompts, got " +
                           std::to_string(out.size()),
                       "prompt");
  return out;
}

// logprobs / top_logprobs: completions take "logprobs": N (the alternatives
// per token); chat takes "logprobs": true and "top_logprobs": N. Returns -1
// when none are asked for.
int parse_logprobs(const json& j, Endpoint endpoint) {
  auto in_range = [](int64_t n, const char* key) {
    if (n < 0 || n > kMaxTopLogprobs)
      throw RequestError(std::string("'") + key + "' must be in [0, " + std::to_string(kMaxTopLogprobs) + "], got " +
                             std::to_string(n),
                         key);
    return static_cast<int>(n);
  };
  if (endpoint == Endpoint::Completions) {
    const json* v = field(j, "logprobs");
    if (v && v->is_boolean())
      wrong_type("logprobs", ("an integer (the alternatives per token, 0.." + std::to_string(kMaxTopLogprobs) + ")").c_str(), *v);
    const auto n = get_int(j, "logprobs");
    return n ? in_range(*n, "logprobs") : -1;
  }
  const bool on = get_bool(j, "logprobs").value_or(false);
  const auto top = get_int(j, "top_logprobs");
  if (top && !on) throw RequestError("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  if (!on) return -1;
  return top ? in_range(*top, "top_logprobs") : 0;
}

std::vector<tok::ChatMessage> parse_messages(const json& j) {
  const json* v = field(j, "messages");
  if (!v)
    throw RequestError(field(j, "prompt") ? "'messages' is required (a request with 'prompt' goes to /v1/completions)"
                                          : "'messages' is required",
                       "messages");
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
    if (!content || !(content->is_string() || content->is_array()))
      throw RequestError("'" + where + ".content' must be a string or an array of text parts, got " +
                             (content ? content->type_name() : "null"),
                         "messages");
    out.push_back({r, content->is_string() ? content->get<std::string>() : text_of_parts(*content, where)});
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
    for (size_t i = 0; i < v->size(); ++i) {
      const json& s = (*v)[i];
      if (!s.is_string())
        throw RequestError("'stop' must be a string or an array of strings, got " + std::string(s.type_name()) +
                               " " + s.dump().substr(0, 40) + " at index " + std::to_string(i),
                           "stop");
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
    r.prompts = parse_prompts(j);
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
      throw RequestError("'temperature' must be a number >= 0 and at most 3.4e38 (a 32-bit float), got " + num(*t),
                         "temperature");
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
  // Fields that change what the client gets back, which this server does
  // not do: refused rather than ignored (their neutral values pass).
  if (auto b = get_int(j, "best_of"); b && *b != 1)
    throw RequestError("'best_of' must be 1 (this server returns the one generated choice), got " + std::to_string(*b),
                       "best_of");
  if (get_bool(j, "echo").value_or(false))
    throw RequestError("'echo' is not supported: the completion does not repeat the prompt", "echo");
  refuse_unless_empty(j, "logit_bias", json::value_t::object, "an object",
                      "the target's distribution is sampled as it is");
  for (const char* key : {"presence_penalty", "frequency_penalty"})
    if (auto v = get_number(j, key); v && *v != 0)
      throw RequestError(std::string("'") + key + "' is not supported: the target's distribution is sampled as it is "
                         "(0 passes), got " + num(*v), key);
  refuse_unless_empty(j, "suffix", json::value_t::string, "a string", "the completion is not followed by a suffix");
  for (const char* key : {"tools", "functions"})
    refuse_unless_empty(j, key, json::value_t::array, "an array", "this server does not call tools");
  if (const json* rf = field(j, "response_format")) {
    if (!rf->is_object()) wrong_type("response_format", "an object", *rf);
    const json* type = field(*rf, "type");
    if (type && (!type->is_string() || type->get<std::string>() != "text"))
      throw RequestError("'response_format' is not supported beyond {\"type\": \"text\"}: the output is not "
                         "constrained, got " + rf->dump().substr(0, 80), "response_format");
  }
  r.stop = parse_stop(j);
  r.top_logprobs = parse_logprobs(j, endpoint);
  if (auto d = get_int(j, "deadline_ms")) {
    if (*d < 1) throw RequestError("'deadline_ms' must be at least 1 (milliseconds), got " + std::to_string(*d), "deadline_ms");
    r.deadline_ms = *d;
  }
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
          {"deadline_exceeded", o.reason == FinishReason::Deadline},
          {"prefill_ms", s.prefill_s * 1e3},
          {"decode_ms", s.decode_s * 1e3}};
}

namespace {

json base(const ResponseMeta& meta, const char* object) {
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}

bool is_chat(const ResponseMeta& m) { return m.endpoint == Endpoint::ChatCompletions; }

// One choice of a streaming chunk.
json stream_choice(const ResponseMeta& meta, json delta_or_text, json finish, int index = 0,
                   json logprobs = nullptr) {
  json c = {{"index", index}};
  if (is_chat(meta)) {
    c["delta"] = std::move(delta_or_text);
  } else {
    c["text"] = std::move(delta_or_text);
  }
  c["logprobs"] = std::move(logprobs);
  c["finish_reason"] = std::move(finish);
  return c;
}

json chunk_base(const ResponseMeta& meta) {
  return base(meta, is_chat(meta) ? "chat.completion.chunk" : "text_completion");
}

}  // namespace

nlohmann::json logprobs_json(Endpoint endpoint, const std::vector<TokenLogprob>& entries, int64_t& text_offset) {
  // Tokens go in as their bytes: the response is dumped with invalid UTF-8
  // replaced (sse_event, the server's send_json).
  auto as_text = [](const std::string& bytes) -> const std::string& { return bytes; };
  auto bytes_of = [](const std::string& b) {
    json a = json::array();
    for (unsigned char c : b) a.push_back(static_cast<int>(c));
    return a;
  };
  if (endpoint == Endpoint::ChatCompletions) {
    json content = json::array();
    for (const TokenLogprob& e : entries) {
      json top = json::array();
      for (const auto& [tok, lp] : e.top)
        top.push_back({{"token", as_text(tok)}, {"logprob", lp}, {"bytes", bytes_of(tok)}});
      content.push_back({{"token", as_text(e.token)}, {"logprob", e.logprob}, {"bytes", bytes_of(e.token)},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  for (const TokenLogprob& e : entries) {
    tokens.push_back(as_text(e.token));
    token_logprobs.push_back(e.logprob);
    if (e.top.empty()) {
      top.push_back(nullptr);
    } else {
      json alt = json::object();
      for (const auto& [tok, lp] : e.top) alt.emplace(as_text(tok), lp);  // the first of equal texts wins
      top.push_back(std::move(alt));
    }
    offsets.push_back(text_offset);
    // Characters start at every byte that is not a UTF-8 continuation byte.
    for (unsigned char c : e.token) text_offset += (c & 0xC0) != 0x80;
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

RequestOutcome combined(const std::vector<RequestOutcome>& outcomes) {
  RequestOutcome all;
  if (outcomes.empty()) return all;
  all.reason = outcomes.front().reason;
  for (const RequestOutcome& o : outcomes) {
    all.prompt_tokens += o.prompt_tokens;
    all.completion_tokens += o.completion_tokens;
    all.speculative = all.speculative || o.speculative;
    all.stats += o.stats;
  }
  return all;
}

nlohmann::json response_json(const ResponseMeta& meta, const std::vector<Choice>& choices) {
  json out = json::array();
  std::vector<RequestOutcome> outcomes;
  for (size_t i = 0; i < choices.size(); ++i) {
    const Choice& c = choices[i];
    json choice = {{"index", i}};
    if (is_chat(meta)) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = c.logprobs;
    choice["finish_reason"] = finish_reason_text(c.outcome.reason);
    out.push_back(std::move(choice));
    outcomes.push_back(c.outcome);
  }
  const RequestOutcome all = combined(outcomes);
  json j = base(meta, is_chat(meta) ? "chat.completion" : "text_completion");
  j["choices"] = std::move(out);
  j["usage"] = usage_json(all);
  j["dspark"] = spec_stats_json(all);
  return j;
}

nlohmann::json response_json(const ResponseMeta& meta, const std::string& text, const RequestOutcome& o) {
  return response_json(meta, std::vector<Choice>{{text, o, nullptr}});
}

nlohmann::json chunk_json(const ResponseMeta& meta, const std::string& text, nlohmann::json logprobs, int index) {
  json j = chunk_base(meta);
  j["choices"] = json::array(
      {stream_choice(meta, is_chat(meta) ? json{{"content", text}} : json(text), nullptr, index, std::move(logprobs))});
  return j;
}

nlohmann::json role_chunk_json(const ResponseMeta& meta) {
  json j = chunk_base(meta);
  j["choices"] = json::array({stream_choice(meta, json{{"role", "assistant"}, {"content", ""}}, nullptr)});
  return j;
}

nlohmann::json final_chunk_json(const ResponseMeta& meta, const RequestOutcome& o, int index) {
  json j = chunk_base(meta);
  j["choices"] = json::array(
      {stream_choice(meta, is_chat(meta) ? json::object() : json(""), finish_reason_text(o.reason), index)});
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
