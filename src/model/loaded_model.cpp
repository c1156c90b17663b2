// LoadedModel: target + tokenizer + chat template; see loaded_model.hpp.
#include "dspark/model/loaded_model.hpp"

#include <algorithm>

#include "dspark/error.hpp"
#include "dspark/io/gguf.hpp"

namespace dspark {

LoadedModel LoadedModel::load(const std::string& path_or_alias, ops::Compute compute) {
  LoadedModel m;
  m.target = load_target(path_or_alias, compute);
  io::GGUFFile file(m.target->info().path);
  m.tokenizer = std::make_unique<tok::Tokenizer>(tok::Tokenizer::from_gguf(file));
  if (m.tokenizer->vocab_size() > m.target->info().vocab) {
    throw FormatError(file.path() + ": tokenizer has " + std::to_string(m.tokenizer->vocab_size()) +
                      " tokens but the embedding has " + std::to_string(m.target->info().vocab) +
                      " rows");
  }
  if (file.has("tokenizer.chat_template")) {
    try {
      m.chat.emplace(tok::ChatTemplate::from_gguf(file, *m.tokenizer));
    } catch (const FormatError& e) {
      // Unsupported template: raw prompts still work; --chat reports it.
      m.no_chat_reason = e.what();
    }
  } else {
    m.no_chat_reason = file.path() +
                       ": the model declares no chat template (tokenizer.chat_template is absent, as in a base "
                       "model)";
  }
  const auto& sp = m.tokenizer->specials();
  for (TokenId id : {sp.eos, sp.eot, m.chat ? m.chat->end_of_turn() : TokenId{-1}}) {
    if (id >= 0 && std::find(m.stop_ids.begin(), m.stop_ids.end(), id) == m.stop_ids.end())
      m.stop_ids.push_back(id);
  }
  return m;
}

std::vector<TokenId> LoadedModel::encode_prompt(const std::string& text, bool use_chat) const {
  if (use_chat) {
    if (!chat) throw Error(no_chat_reason + "; run without --chat for plain completion");
    return chat->apply({{"user", text}}, true);
  }
  std::vector<TokenId> ids;
  if (tokenizer->specials().add_bos && tokenizer->specials().bos >= 0)
    ids.push_back(tokenizer->specials().bos);
  auto body = tokenizer->encode(text, true);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

}  // namespace dspark
