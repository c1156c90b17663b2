// ChatML and Gemma formatting driven by the GGUF's `tokenizer.chat_template`.
#include "dspark/tokenizer/chat_template.hpp"

#include "dspark/error.hpp"

namespace dspark::tok {

namespace {

constexpr std::string_view kStart = "<|im_start|>";
constexpr std::string_view kEnd = "<|im_end|>";
constexpr std::string_view kGemmaStart = "<start_of_turn>";
constexpr std::string_view kGemmaEnd = "<end_of_turn>";

// Markers of each format, and the role its generation prompt opens.
struct Markers {
  std::string_view start, end, assistant;
};
Markers markers(ChatFormat f) {
  return f == ChatFormat::Gemma ? Markers{kGemmaStart, kGemmaEnd, "model"} : Markers{kStart, kEnd, "assistant"};
}

// Jinja's `trim`: surrounding whitespace removed.
std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// Reads the Jinja (Python-style) string literal whose opening quote is at
// `open`; returns false when it is not terminated.
bool read_string_literal(const std::string& t, size_t open, std::string& out) {
  const char q = t[open];
  out.clear();
  for (size_t i = open + 1; i < t.size(); ++i) {
    const char c = t[i];
    if (c == q) return true;
    if (c != '\\' || i + 1 == t.size()) {
      out.push_back(c);
      continue;
    }
    const char e = t[++i];
    switch (e) {
      case 'n': out.push_back('\n'); break;
      case 't': out.push_back('\t'); break;
      case 'r': out.push_back('\r'); break;
      case '\\': case '\'': case '"': out.push_back(e); break;
      default: out.push_back('\\'); out.push_back(e); break;
    }
  }
  return false;
}

// The system prompt a ChatML template writes as a literal turn when the
// conversation does not open with a system message, e.g. SmolLM2's
//   {% if loop.first and messages[0]['role'] != 'system' %}
//   {{ '<|im_start|>system\nYou are ...<|im_end|>\n' }}{% endif %}
std::optional<std::string> find_default_system(const std::string& tmpl) {
  const bool tests_role = tmpl.find("!= 'system'") != std::string::npos ||
                          tmpl.find("!= \"system\"") != std::string::npos ||
                          tmpl.find("== 'system'") != std::string::npos ||
                          tmpl.find("== \"system\"") != std::string::npos;
  if (!tests_role) return std::nullopt;
  const std::string head = std::string(kStart) + "system\n";
  std::string lit;
  for (size_t pos = tmpl.find(std::string(kStart) + "system"); pos != std::string::npos;
       pos = tmpl.find(std::string(kStart) + "system", pos + 1)) {
    if (pos == 0 || (tmpl[pos - 1] != '\'' && tmpl[pos - 1] != '"')) continue;
    if (!read_string_literal(tmpl, pos - 1, lit)) continue;
    if (lit.rfind(head, 0) != 0) continue;
    const std::string tail = std::string(kEnd) + "\n";
    if (lit.size() < head.size() + tail.size() || lit.compare(lit.size() - tail.size(), tail.size(), tail) != 0) {
      continue;
    }
    std::string content = lit.substr(head.size(), lit.size() - head.size() - tail.size());
    if (content.find(kEnd) != std::string::npos) continue;
    return content;
  }
  return std::nullopt;
}

void check_roles(const std::vector<ChatMessage>& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant") {
      throw InvalidArgument("chat message " + std::to_string(i) + " has role '" + r +
                            "'; expected system, user or assistant");
    }
  }
}

}  // namespace

ChatTemplate ChatTemplate::from_gguf(const io::GGUFFile& file, const Tokenizer& tokenizer) {
  const std::string key = "tokenizer.chat_template";
  if (!file.has(key)) {
    throw FormatError(file.path() + ": missing metadata key '" + key +
                      "': the model declares no chat template (a base model?); cannot format chat prompts");
  }
  return from_text(file.get_string(key), tokenizer, file.path());
}

ChatTemplate ChatTemplate::from_text(const std::string& tmpl, const Tokenizer& tokenizer, const std::string& source) {
  ChatFormat format;
  if (tmpl.find(kStart) != std::string::npos) {
    format = ChatFormat::ChatML;
  } else if (tmpl.find(kGemmaStart) != std::string::npos) {
    format = ChatFormat::Gemma;
  } else {
    std::string head = tmpl.substr(0, 80);
    if (tmpl.size() > head.size()) head += "...";
    throw FormatError(source + ": unsupported chat template (supported: ChatML, marked by '<|im_start|>', "
                      "and Gemma, marked by '<start_of_turn>'): \"" + head + "\"");
  }
  const Markers mk = markers(format);
  const auto start = tokenizer.find_token(mk.start);
  const auto end = tokenizer.find_token(mk.end);
  if (!start || !end) {
    throw FormatError(source + ": the chat template is " + (format == ChatFormat::Gemma ? "Gemma" : "ChatML") +
                      " but the vocabulary lacks '" + std::string(start ? mk.end : mk.start) + "'");
  }
  return ChatTemplate(tokenizer, format, *start, *end,
                      format == ChatFormat::ChatML ? find_default_system(tmpl) : std::nullopt);
}

std::vector<ChatTemplate::Turn> ChatTemplate::turns(const std::vector<ChatMessage>& messages) const {
  check_roles(messages);
  std::vector<Turn> out;
  if (format_ == ChatFormat::ChatML) {
    if (default_system_ && !messages.empty() && messages.front().role != "system")
      out.push_back({"system", *default_system_});
    for (const auto& m : messages) out.push_back({m.role, m.content});
    return out;
  }
  // Gemma: a leading system message becomes a prefix of the first user turn.
  size_t first = 0;
  std::string prefix;
  if (!messages.empty() && messages.front().role == "system") {
    prefix = messages.front().content + "\n\n";
    first = 1;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool user_turn = (i - first) % 2 == 0;
    if ((m.role == "user") != user_turn || m.role == "system")
      throw InvalidArgument("chat message " + std::to_string(i) + " has role '" + m.role +
                            "'; the Gemma template needs an optional system message first, then user and "
                            "assistant messages alternating, starting with user");
    out.push_back({m.role == "assistant" ? "model" : m.role, (i == first ? prefix : "") + trim(m.content)});
  }
  return out;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  const Markers mk = markers(format_);
  std::string out;
  for (const auto& t : turns(messages))
    out.append(mk.start).append(t.role).append("\n").append(t.content).append(mk.end).append("\n");
  if (add_generation_prompt) out.append(mk.start).append(mk.assistant).append("\n");
  return out;
}

std::vector<TokenId> ChatTemplate::apply(const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt) const {
  const std::vector<Turn> ts = turns(messages);
  std::vector<TokenId> out;
  const SpecialIds& sp = tok_->specials();
  if (sp.add_bos && sp.bos >= 0) out.push_back(sp.bos);
  auto append = [&](const std::vector<TokenId>& ids) { out.insert(out.end(), ids.begin(), ids.end()); };
  const std::vector<TokenId> newline = tok_->encode("\n", false);
  // The text between two markers is encoded as one run, as a tokenizer that
  // splits the rendered string at special tokens would see it.
  for (const auto& t : ts) {
    out.push_back(start_of_turn_);
    append(tok_->encode(t.role + "\n" + t.content, false));
    out.push_back(end_of_turn_);
    append(newline);
  }
  if (add_generation_prompt) {
    out.push_back(start_of_turn_);
    append(tok_->encode(std::string(markers(format_).assistant) + "\n", false));
  }
  return out;
}

}  // namespace dspark::tok
