// dspark/tokenizer/chat_template.hpp — chat formatting for the templates the
// supported GGUF files declare in `tokenizer.chat_template`.
//
// Supported, recognised by a marker in the template text:
//   ChatML ("<|im_start|>"): `<|im_start|>role\ncontent<|im_end|>\n`,
//     generation prompt `<|im_start|>assistant\n`;
//   Gemma ("<start_of_turn>"): `<start_of_turn>role\ncontent<end_of_turn>\n`
//     with the assistant's role written "model", content trimmed of
//     surrounding whitespace, a leading system message prepended to the first
//     user turn (followed by a blank line), user and assistant strictly
//     alternating; generation prompt `<start_of_turn>model\n` (the Gemma 3
//     template; llama.cpp's built-in "gemma" format).
// A general Jinja engine is deliberately not implemented.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dspark/tokenizer/tokenizer.hpp"

namespace dspark::tok {

struct ChatMessage {
  std::string role;     // "system" | "user" | "assistant"
  std::string content;  // plain text; special-token text inside stays literal
};

enum class ChatFormat { ChatML, Gemma };

class ChatTemplate {
 public:
  /// Detects the format from the GGUF's `tokenizer.chat_template`. Throws
  /// dspark::FormatError when the key is absent (a base model; the message
  /// says so) or the template is not one of the supported formats (the
  /// message quotes the first characters of it), or
  /// when the vocabulary lacks the format's marker tokens. A template that
  /// writes a literal system turn ('<|im_start|>system\n...<|im_end|>\n') under
  /// a condition on the first message's role being 'system', as SmolLM2's does,
  /// gives that text as default_system_prompt().
  static ChatTemplate from_gguf(const io::GGUFFile& file, const Tokenizer& tokenizer);

  /// The same detection on the template text itself; `source` names its
  /// origin in error messages.
  static ChatTemplate from_text(const std::string& tmpl, const Tokenizer& tokenizer, const std::string& source);

  /// Token ids of the formatted conversation. Role markers are special tokens;
  /// message content is encoded with parse_special = false. When the template
  /// has a default system prompt and the first message is not a system
  /// message, the default system turn comes first (nothing is added to an
  /// empty conversation). When `add_generation_prompt`, ends with the
  /// assistant header. Adds BOS when the tokenizer's add_bos is set. Equals
  /// encode(render(...), true) whenever no content contains special-token
  /// text. Throws InvalidArgument on an unknown role (allowed: system, user,
  /// assistant), and for Gemma on a system message after the first or roles
  /// that do not alternate user, assistant, user, ...
  std::vector<TokenId> apply(const std::vector<ChatMessage>& messages,
                             bool add_generation_prompt) const;

  /// The conversation as text, exactly as the model's template renders it
  /// (without the BOS a template such as Gemma's writes first; apply() adds
  /// it per add_bos). Throws as apply() does.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  /// The id that ends an assistant turn (<|im_end|>, <end_of_turn>), looked up
  /// in the vocabulary.
  TokenId end_of_turn() const { return end_of_turn_; }
  /// The detected template family.
  ChatFormat format() const { return format_; }
  /// The system prompt the template inserts when a conversation does not start
  /// with a system message; empty optional when it inserts none.
  const std::optional<std::string>& default_system_prompt() const { return default_system_; }

 private:
  struct Turn {
    std::string role, content;  // as written between the markers
  };
  /// The turns the format writes for `messages` (roles checked).
  std::vector<Turn> turns(const std::vector<ChatMessage>& messages) const;

  ChatTemplate(const Tokenizer& tok, ChatFormat f, TokenId start, TokenId eot,
               std::optional<std::string> default_system)
      : tok_(&tok), format_(f), start_of_turn_(start), end_of_turn_(eot),
        default_system_(std::move(default_system)) {}
  const Tokenizer* tok_;
  ChatFormat format_;
  TokenId start_of_turn_;
  TokenId end_of_turn_;
  std::optional<std::string> default_system_;
};

}  // namespace dspark::tok
