// dspark/train/export_data.hpp — a `dspark regen` data set as conversations
// for other trainers (`dspark export-data`), so that the target-written data
// made here can train a drafter at full scale elsewhere (DeepSpec on GPUs)
// and the drafter come back with `dspark import`.
//
// One JSON object a line, one line per stored sequence, in data-set order:
//   deepspec  {"id": ID, "conversations": [{"role": "user", "content": PROMPT},
//                                          {"role": "assistant", "content": RESPONSE}]}
//   sharegpt  {"id": ID, "conversations": [{"from": "human", "value": PROMPT},
//                                          {"from": "gpt", "value": RESPONSE}]}
// PROMPT is the user message of the prompts file the data was generated from
// (looked up by the sequence's prompt id); RESPONSE is the decoded response
// (the supervised tokens), without the end-of-turn token that closes a
// finished response: the reading trainer renders the conversation with the
// target's chat template, which writes it back. Only single-turn chat data
// (prompt tokens, then response tokens) is exported; `--raw` data has no
// conversation and is refused.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dspark/model/loaded_model.hpp"
#include "dspark/train/data.hpp"
#include "dspark/train/regen.hpp"

namespace dspark::train {

enum class ConversationFormat { DeepSpec, ShareGPT };
std::string to_string(ConversationFormat f);
/// "deepspec" | "sharegpt"; throws InvalidArgument otherwise.
ConversationFormat parse_conversation_format(const std::string& s);

struct ConversationExportOptions {
  ConversationFormat format = ConversationFormat::DeepSpec;
  /// Leave out responses cut by the length limit (no end-of-turn token):
  /// the reading trainer would otherwise learn an end of turn where the
  /// target had not ended.
  bool drop_unfinished = false;
};

struct ConversationExportStats {
  int64_t written = 0;
  int64_t unfinished = 0;     // written or dropped responses without an end-of-turn token
  int64_t dropped = 0;        // left out (drop_unfinished)
  /// Written sequences whose conversation, rendered with this target's chat
  /// template and tokenizer (prompt, response, end-of-turn when finished),
  /// gives back exactly the stored token ids: what another trainer that
  /// tokenizes the same way trains on.
  int64_t reencoded_exactly = 0;
};

/// Writes `data` (a data set `model` generated with its chat template) as
/// conversations to `out_path` (atomically). `prompts` are the prompts file
/// entries the data was generated from. Throws InvalidArgument when the data
/// set was made by another target or without the chat template (manifest
/// "chat_template": false), or the model has no chat template; FormatError
/// naming the sequence when its prompt id is not among `prompts` or its mask
/// is not prompt-then-response; Error on I/O failure.
ConversationExportStats export_conversations(const TrainDataset& data, const std::vector<PromptEntry>& prompts,
                                             const LoadedModel& model, const std::string& out_path,
                                             const ConversationExportOptions& opts = {});

}  // namespace dspark::train
