// dspark/train/data_fingerprint.hpp — what a training run records about its
// data, so that a run continued elsewhere can tell whether it reads the same
// data (the trainer refuses to resume on other data).
#pragma once

#include <nlohmann/json.hpp>

#include "dspark/train/data.hpp"

namespace dspark::train {

/// {"n_sequences", "n_tokens", "n_supervised",
///  "hash": 16 hex digits, FNV-1a 64 over every sequence in order (its
///          length, then each token id as 4 little-endian bytes and its mask
///          byte): ids alone are not enough, the order and the cut into
///          sequences decide the training order and the held-out split,
///  "recipe": the manifest's keys that say how the data was made (format,
///            target_id, target_path, prompts_file, sampling, chat_template;
///            those present)}.
/// Equal hashes: the same sequences in the same order (up to a 64-bit
/// collision), whatever the shard layout. The recipe is informative only.
nlohmann::json data_fingerprint(const TrainDataset& data);

}  // namespace dspark::train
