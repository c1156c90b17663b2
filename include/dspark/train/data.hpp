// dspark/train/data.hpp — the drafter training data set on disk
// (produced by `dspark regen`, read by `dspark train`).
//
// A data set is a directory holding (format "dspark-regen-v1", see regen.hpp)
//   manifest.json   {"format": "dspark-regen-v1", "target_id": "...",
//                    "n_sequences": N, "shards": [{"file": "data-00000.safetensors",
//                    "n_sequences": n, ...}, ...], ...}
//   data-XXXXX.safetensors, each with, for the sequences of that shard:
//     "tokens"     int32 [N_tok]      every sequence's token ids, concatenated
//     "offsets"    int64 [n_seq + 1]  sequence s is tokens[offsets[s], offsets[s+1])
//     "loss_mask"  uint8 [N_tok]      1 = assistant token (supervised), 0 = prompt
//   and optional metadata "prompt_ids" (a JSON array of n_seq strings).
// Shard names are relative to the directory; a shard entry may also be a
// plain file-name string. Other manifest keys (e.g. the sampling settings of
// the regeneration) are kept and ignored. Target features are not stored:
// the trainer recomputes them with the target.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "dspark/model/target.hpp"

namespace dspark::train {

/// One training sequence: prompt + response tokens and their supervision mask.
struct TrainSequence {
  std::string id;                  // the shard's prompt id ("" when not recorded)
  std::vector<TokenId> tokens;     // [L]
  std::vector<uint8_t> loss_mask;  // [L] 1 = supervised
};

struct TrainDataset {
  std::string target_id;
  std::vector<TrainSequence> sequences;
  nlohmann::json manifest;  // the manifest as read

  /// Reads `dir`/manifest.json and every shard it lists. Throws dspark::Error
  /// when the directory or a file is missing and dspark::FormatError (naming
  /// the file and tensor) when: the manifest lacks target_id / shards or has
  /// the wrong types, or names a "format" other than dspark-regen-v1; a shard lacks one of the three tensors or has another
  /// dtype (tokens int32 or int64, offsets int64, loss_mask uint8 or bool) or
  /// rank; offsets do not start at 0, decrease, or do not end at N_tok;
  /// loss_mask and tokens differ in length; a token id is negative; or the
  /// sequence count differs from n_sequences (when present).
  static TrainDataset load(const std::string& dir);

  /// Supervised tokens over all sequences.
  int64_t supervised_tokens() const;
};

/// Writes `sequences` as a data set in `dir` (created if needed), in the
/// layout `dspark regen` writes (format tag, per-shard counts, "prompt_ids"
/// metadata; an empty id becomes "seq-<index>"): shards of at most
/// `per_shard` sequences, then manifest.json (atomically, last, so a reader
/// never sees a manifest naming missing shards). `extra` keys are merged
/// into the manifest. Throws InvalidArgument when a
/// sequence's mask length differs from its token count or per_shard < 1,
/// dspark::Error on I/O failure.
void write_dataset(const std::string& dir, const std::string& target_id,
                   const std::vector<TrainSequence>& sequences, int64_t per_shard = 4096,
                   const nlohmann::json& extra = nlohmann::json::object());

}  // namespace dspark::train
