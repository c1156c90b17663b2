// dspark/train/feature_cache.hpp — target features of training sequences
// kept on disk, so that later passes over a data set skip the target.
//
// One file per sequence (DIR/seq-NNNNNNNN.bin), written atomically
// (io::write_file_atomic), holding a small header, the taps [L, m*d] and the
// final-normed hidden [L, d] in the trainer's storage dtype (bf16, or fp32
// with --precision fp32), and with a draft vocabulary the target's
// full-vocabulary logsumexp [L] fp32 and argmax [L] int64. The header records
// a hash of the sequence's tokens, so a file made from other tokens (a data
// set that changed) is recomputed, never misread. DIR/cache.json records what
// every file depends on (FeatureCacheKey); a directory made for another key
// is refused. Stored values are exactly the ones the trainer computes, so a
// step from the cache equals a recomputed step bit for bit.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dspark/model/target.hpp"

namespace dspark::train {

/// A sequence's target features as the trainer stores them.
struct TargetFeatures {
  at::Tensor taps;          // [L, m*d] bf16 or fp32
  at::Tensor final_hidden;  // [L, d], same dtype
  at::Tensor lse;           // [L] fp32, or undefined (no draft vocabulary)
  at::Tensor argmax;        // [L] int64, or undefined
  /// Bytes of all four tensors.
  int64_t bytes() const;
};

/// What the stored features depend on.
struct FeatureCacheKey {
  std::string target_id;       // TargetInfo::id @ TargetInfo::compute
  std::vector<int> tap_layers;  // the drafter's tapped layers
  int64_t max_len = 0;          // sequences truncated to this many tokens
  bool bf16 = true;             // storage dtype (bf16, else fp32)
  bool logit_stats = false;     // lse and argmax stored (draft vocabulary)
  bool operator==(const FeatureCacheKey&) const = default;
};

/// Bytes one token's features take: (m + 1) * d values of 2 (bf16) or 4
/// bytes, plus 12 with logit statistics.
int64_t feature_bytes_per_token(const FeatureCacheKey& key, int64_t hidden);

class DiskFeatureCache {
 public:
  /// Opens `dir`, creating it and its cache.json when missing. Throws
  /// InvalidArgument naming both keys when `dir` holds a cache made for
  /// another key, FormatError for an unreadable cache.json, Error when the
  /// directory cannot be created.
  DiskFeatureCache(std::string dir, FeatureCacheKey key);

  /// The stored features of sequence `index` when its file exists, is
  /// complete and was made from exactly `tokens`; std::nullopt otherwise (an
  /// unreadable or truncated file is reported once on stderr and recomputed).
  std::optional<TargetFeatures> get(size_t index, std::span<const TokenId> tokens) const;

  /// Stores the features of sequence `index`. Writing stops (with one line
  /// on stderr) when the file system would keep less than `reserve_bytes`
  /// free, or on an I/O error; training goes on recomputing.
  void put(size_t index, std::span<const TokenId> tokens, const TargetFeatures& f);

  const std::string& dir() const { return dir_; }
  /// Free bytes on the cache's file system.
  int64_t free_bytes() const;
  /// Files read and written since construction.
  int64_t hits() const { return hits_; }
  int64_t writes() const { return writes_; }

  static constexpr int64_t reserve_bytes = int64_t{1} << 30;  // 1 GiB left free

 private:
  std::string path_of(size_t index) const;

  std::string dir_;
  FeatureCacheKey key_;
  bool writing_ = true;
  mutable bool warned_read_ = false;
  mutable int64_t hits_ = 0;
  int64_t writes_ = 0;
};

}  // namespace dspark::train
