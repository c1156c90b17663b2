// dspark/speculative/drafter_config.hpp — a drafter's configuration and its
// dspark.json form, apart from the tensors (drafter.hpp) so that config
// readers build without the tensor library.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "dspark/speculative/sampling.hpp"

namespace dspark {

struct TargetInfo;

/// Largest block size a drafter accepts (tokens per round).
inline constexpr int kMaxGamma = 32;

/// Sequential head variants (dspark-method.md §2).
enum class SeqHead { None, Markov, Gated, Rnn, Elman };
std::string to_string(SeqHead h);
/// Parses "none" | "markov" | "gated" | "rnn" | "elman"; throws InvalidArgument.
SeqHead parse_seq_head(const std::string& s);

struct DrafterConfig {
  int gamma = 7;             // γ: draft tokens per round
  int n_layers = 1;          // draft layers
  int n_heads = 0;           // attention heads (default: the target's)
  int n_kv_heads = 0;        // KV heads (default: the target's)
  int head_dim = 0;          // (default: the target's)
  int ffn = 0;               // MLP width (default: the target's)
  int markov_rank = 32;      // r; must be a multiple of 32
  std::vector<int> tap_layers;  // target layers whose outputs are tapped (0-based)
  SeqHead seq_head = SeqHead::Markov;
  int mask_token_id = -1;    // >= 0: that embedding row is MASK; -1: learned mask embedding
  double rope_base = 10000.0;
  double eps = 1e-5;
  // Target identity and dims the drafter was built for.
  std::string target_id;
  int64_t hidden = 0;        // d
  int64_t vocab = 0;         // V
  /// Confidence thresholds per position from calibration (empty = none).
  /// With sts_temperatures present they apply to the calibrated survival
  /// â_k = ∏_{i<=k} σ(z_i / T_i), otherwise to σ(z_k) (see prune_length).
  std::vector<double> sts_thresholds;
  /// STS temperatures T_k per position from calibration (dspark-method.md §6;
  /// empty = uncalibrated, i.e. T = 1).
  std::vector<double> sts_temperatures;
  /// The rest of the calibration record `dspark calibrate` writes beside the
  /// thresholds and temperatures (per-position acceptance, ECE and AUROC
  /// before/after, bins, samples, target) as one JSON object's text; empty =
  /// none. Informational: kept through save, export and import, never read.
  std::string sts_report;
  /// Draft vocabulary: the token ids the drafter may propose, strictly
  /// ascending (empty = the whole vocabulary). At inference the LM head and
  /// the sequential head's output rows are restricted to these rows, so each
  /// drafting pass costs |draft_vocab| instead of V rows (a reduced draft
  /// vocabulary, as in EAGLE-3 / FR-Spec). Lossless either way: the target
  /// verifies every token, and under sampling q is exactly the distribution
  /// drawn from (zero outside the draft vocabulary). Training optimizes that
  /// same restricted distribution (see dspark/train/loss.hpp).
  std::vector<TokenId> draft_vocab;

  int m() const { return static_cast<int>(tap_layers.size()); }
  /// Fills zero fields from the target (heads, ffn, rope, dims, taps spread
  /// over layers 1..L-3) and checks consistency; throws InvalidArgument.
  void complete_from(const TargetInfo& target);
  /// Throws InvalidArgument when a field is out of range.
  void validate() const;
};

/// Reads only dspark.json (for tools that update it, e.g. calibration).
nlohmann::json read_drafter_json(const std::string& dir);

/// Parses the "config"/"dims" part of dspark.json.
DrafterConfig config_from_json(const nlohmann::json& j, const std::string& where);
nlohmann::json config_to_json(const DrafterConfig& c);
/// The "sts" object of dspark.json: the calibration record, thresholds and
/// temperatures (empty when the drafter is uncalibrated).
nlohmann::json sts_json(const DrafterConfig& c);
/// The keys of a "sts" object other than thresholds and temperatures, as JSON
/// text (DrafterConfig::sts_report); empty when there are none.
std::string sts_report_of(const nlohmann::json& sts);

}  // namespace dspark
