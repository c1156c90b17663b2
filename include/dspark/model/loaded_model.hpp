// dspark/model/loaded_model.hpp — a target with its tokenizer and chat
// template, as every front end (generate, bench, serve) needs them.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dspark/model/target.hpp"
#include "dspark/tokenizer/chat_template.hpp"
#include "dspark/tokenizer/tokenizer.hpp"

namespace dspark {

struct LoadedModel {
  std::unique_ptr<TargetModel> target;
  std::unique_ptr<tok::Tokenizer> tokenizer;
  std::optional<tok::ChatTemplate> chat;  // absent when the GGUF declares none we support
  std::string no_chat_reason;             // why `chat` is absent
  std::vector<TokenId> stop_ids;          // eos, eot and the chat end-of-turn, deduplicated

  /// Loads model, tokenizer and chat template from a GGUF path or alias.
  /// Throws dspark::Error / FormatError (see load_target, Tokenizer::from_gguf).
  static LoadedModel load(const std::string& path_or_alias, ops::Compute compute = ops::Compute::Quant);

  /// Prompt ids. With `chat`, `text` becomes one user message followed by the
  /// generation prompt (content tokenized with special-token parsing off);
  /// otherwise the raw text is tokenized with special tokens parsed (as
  /// llama.cpp does for -p) and BOS prepended when the model asks for it.
  /// Throws dspark::Error when `chat` is requested but no template is known
  /// (saying why: none declared, or one of an unsupported format).
  std::vector<TokenId> encode_prompt(const std::string& text, bool chat) const;
};

}  // namespace dspark
