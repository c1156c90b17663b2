// Byte-pair merging over token ids.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace dspark::tok::detail {

/// A ranked merge table keyed by the pair of token ids it joins. The merge of
/// a pair (left, right) produces `merged`; a lower `rank` merges first.
class MergeTable {
 public:
  struct Entry {
    uint64_t key = 0;  // (left << 32) | right; kEmpty when the slot is free
    int32_t rank = 0;
    int32_t merged = 0;
  };

  /// Prepares room for `n` merges.
  void reserve(size_t n);
  /// Adds a merge; returns false (and changes nothing) when the pair is
  /// already present, so the first occurrence keeps its rank.
  bool insert(int32_t left, int32_t right, int32_t rank, int32_t merged);
  /// The merge for (left, right), or nullptr.
  const Entry* find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = pack(left, right);
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      const Entry& e = slots_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t pack(int32_t l, int32_t r) {
    return (uint64_t(uint32_t(l)) << 32) | uint32_t(r);
  }
  size_t slot_of(uint64_t key) const {
    return size_t((key * 0x9E3779B97F4A7C15ull) >> shift_) & mask_;
  }
  void grow();
  std::vector<Entry> slots_;
  size_t size_ = 0;
  size_t mask_ = 0;
  int shift_ = 64;
};

/// Reusable working memory for bpe_merge (one per encode call).
struct BpeScratch {
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t left, right;  // ids the pair had when queued; stale if they changed
    int32_t merged;
  };
  std::vector<int32_t> ids, prev, next;
  std::vector<Candidate> heap;
};

/// Runs the merges on the symbols `scratch.ids` (one id per byte symbol) and
/// appends the result to `out`. Order: the pair with the lowest rank merges
/// first; among equal ranks the leftmost pair. Each merge joins one adjacent
/// pair, after which the neighbouring pairs are re-examined.
void bpe_merge(const MergeTable& merges, BpeScratch& scratch, std::vector<int32_t>& out);

}  // namespace dspark::tok::detail
