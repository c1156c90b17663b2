// dspark/speculative/checkpoint.hpp — the drafter checkpoint format
// (dspark-method.md §8): a directory holding `dspark.json` and
// `model.safetensors` (or a sharded set with model.safetensors.index.json).
//
// dspark.json:
//   {"kind": "dspark-drafter", "variant": "dspark" | "dflash", "version": 1,
//    "target_id": "...",
//    "config": {"gamma", "d_draft", "n_layers", "n_heads", "n_kv_heads",
//               "head_dim", "ffn", "markov_rank", "tap_layers", "seq_head",
//               "mask_token_id", "rope_base", "sts"?},
//    "dims": {"hidden_size", "vocab_size", "eps"},
//    "param_names": [...], "weights_bytes": N, "dtype": "bf16" | "f32"}
// "sts" (written by calibration): {"thresholds": [γ], "temperatures": [γ]?,
// "target": precision, "samples": n}.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "dspark/speculative/drafter.hpp"

namespace dspark {

/// Writes `drafter` to `dir` (created if needed). Tensors are stored as bf16
/// (`bf16` true, the shipping format) or fp32 (training checkpoints). Each
/// file is written atomically (temporary file + rename); the weights go first
/// and dspark.json records their size, so a reader never pairs a new config
/// with half-written weights. `extra` keys are merged into dspark.json.
/// Throws dspark::Error on I/O failure.
void save_drafter(const Drafter& drafter, const std::string& dir, bool bf16 = true,
                  const nlohmann::json& extra = nlohmann::json::object());

/// Reads a drafter directory. Dispatches on "variant": "dspark" and legacy
/// "dflash" (no sequential head; missing Markov/confidence tensors start at
/// their initial values) load; a dspark.json without "variant" is an obsolete
/// format and is refused with a message saying how to retrain. Throws
/// dspark::FormatError naming the file and key for any malformed content:
/// among others a non-integer integer field (gamma 7.5, a draft-vocabulary
/// id 17.5), and a seq_head that is "none" or missing while the weights hold
/// a sequential head (its own tensors, or a non-zero markov_w2.weight), so
/// that a drafter never loads as a weaker one than it is.
Drafter load_drafter(const std::string& dir);

/// Refuses a drafter built for another target: throws dspark::InvalidArgument
/// quoting both target ids / dims.
void check_drafter_matches(const DrafterConfig& cfg, const TargetInfo& target);

}  // namespace dspark
