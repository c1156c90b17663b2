// dspark/tokenizer/chat_template.hpp — chat formatting for the templates the
// supported GGUF files declare in `tokenizer.chat_template`.
//
// Supported: ChatML (`<|im_start|>role\ncontent<|im_end|>\n`, generation prompt
// `<|im_start|>assistant\n`), recognised by the template text containing
// "<|im_start|>". A general Jinja engine is deliberately not implemented.
#pragma once

#include <string>
#include <vector>

#include "dspark/tokenizer/tokenizer.hpp"

namespace dspark::tok {

struct ChatMessage {
  std::string role;     // "system" | "user" | "assistant"
  std::string content;  // plain text; special-token text inside stays literal
};

enum class ChatFormat { ChatML };

class ChatTemplate {
 public:
  /// Detects the format from the GGUF's `tokenizer.chat_template`. Throws
  /// dspark::FormatError when the key is absent or the template is not one of
  /// the supported formats (the message quotes the first characters of it).
  static ChatTemplate from_gguf(const io::GGUFFile& file, const Tokenizer& tokenizer);

  /// Token ids of the formatted conversation. Role markers are special tokens;
  /// message content is encoded with parse_special = false. When
  /// `add_generation_prompt`, ends with the assistant header. Adds BOS when the
  /// tokenizer's add_bos is set. Throws InvalidArgument on an unknown role.
  std::vector<TokenId> apply(const std::vector<ChatMessage>& messages,
                             bool add_generation_prompt) const;

  /// The id that ends an assistant turn (e.g. <|im_end|>).
  TokenId end_of_turn() const { return end_of_turn_; }
  ChatFormat format() const { return format_; }

 private:
  ChatTemplate(const Tokenizer& tok, ChatFormat f, TokenId eot) : tok_(&tok), format_(f), end_of_turn_(eot) {}
  const Tokenizer* tok_;
  ChatFormat format_;
  TokenId end_of_turn_;
};

}  // namespace dspark::tok
