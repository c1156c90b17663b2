// ChatML formatting driven by the GGUF's `tokenizer.chat_template`.
#include "dspark/tokenizer/chat_template.hpp"

#include "dspark/error.hpp"

namespace dspark::tok {

namespace {

constexpr std::string_view kStart = "<|im_start|>";
constexpr std::string_view kEnd = "<|im_end|>";

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
    throw FormatError(file.path() + ": missing metadata key '" + key + "'; cannot format chat prompts");
  }
  return from_text(file.get_string(key), tokenizer, file.path());
}

ChatTemplate ChatTemplate::from_text(const std::string& tmpl, const Tokenizer& tokenizer, const std::string& source) {
  if (tmpl.find(kStart) == std::string::npos) {
    std::string head = tmpl.substr(0, 80);
    if (tmpl.size() > head.size()) head += "...";
    throw FormatError(source + ": unsupported chat template (only ChatML, marked by '<|im_start|>', "
                      "is supported): \"" + head + "\"");
  }
  const auto start = tokenizer.find_token(kStart);
  const auto end = tokenizer.find_token(kEnd);
  if (!start || !end) {
    throw FormatError(source + ": the chat template is ChatML but the vocabulary lacks '" +
                      std::string(start ? kEnd : kStart) + "'");
  }
  return ChatTemplate(tokenizer, ChatFormat::ChatML, *start, *end, find_default_system(tmpl));
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  check_roles(messages);
  std::string out;
  auto turn = [&](const std::string& role, const std::string& content) {
    out.append(kStart).append(role).append("\n").append(content).append(kEnd).append("\n");
  };
  if (default_system_ && !messages.empty() && messages.front().role != "system") turn("system", *default_system_);
  for (const auto& m : messages) turn(m.role, m.content);
  if (add_generation_prompt) out.append(kStart).append("assistant\n");
  return out;
}

std::vector<TokenId> ChatTemplate::apply(const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt) const {
  check_roles(messages);
  std::vector<TokenId> out;
  const SpecialIds& sp = tok_->specials();
  if (sp.add_bos && sp.bos >= 0) out.push_back(sp.bos);
  auto append = [&](const std::vector<TokenId>& ids) { out.insert(out.end(), ids.begin(), ids.end()); };
  const std::vector<TokenId> newline = tok_->encode("\n", false);
  // The text between two markers is encoded as one run, as a tokenizer that
  // splits the rendered string at special tokens would see it.
  auto turn = [&](const std::string& role, const std::string& content) {
    out.push_back(start_of_turn_);
    append(tok_->encode(role + "\n" + content, false));
    out.push_back(end_of_turn_);
    append(newline);
  };
  if (default_system_ && !messages.empty() && messages.front().role != "system") turn("system", *default_system_);
  for (const auto& m : messages) turn(m.role, m.content);
  if (add_generation_prompt) {
    out.push_back(start_of_turn_);
    append(tok_->encode("assistant\n", false));
  }
  return out;
}

}  // namespace dspark::tok
