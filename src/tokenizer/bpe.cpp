#include "bpe.hpp"

#include <algorithm>

namespace dspark::tok::detail {

void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  if (cap <= slots_.size()) return;
  std::vector<Entry> old;
  old.swap(slots_);
  slots_.assign(cap, Entry{kEmpty, 0, 0});
  mask_ = cap - 1;
  shift_ = 64;
  for (size_t c = cap; c > 1; c >>= 1) --shift_;
  size_ = 0;
  for (const Entry& e : old) {
    if (e.key == kEmpty) continue;
    for (size_t i = slot_of(e.key);; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty) {
        slots_[i] = e;
        ++size_;
        break;
      }
    }
  }
}

void MergeTable::grow() { reserve(std::max<size_t>(16, slots_.size())); }

bool MergeTable::insert(int32_t left, int32_t right, int32_t rank, int32_t merged) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  const uint64_t key = pack(left, right);
  for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
    Entry& e = slots_[i];
    if (e.key == key) return false;
    if (e.key == kEmpty) {
      e = Entry{key, rank, merged};
      ++size_;
      return true;
    }
  }
}

namespace {

// Min-heap order on (rank, pos): std heap functions build a max-heap, so the
// comparison is "a after b".
bool after(const BpeScratch::Candidate& a, const BpeScratch::Candidate& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
}

}  // namespace

void bpe_merge(const MergeTable& merges, BpeScratch& s, std::vector<int32_t>& out) {
  auto& ids = s.ids;
  const int32_t n = static_cast<int32_t>(ids.size());
  if (n <= 1) {
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  if (n == 2) {
    if (const auto* m = merges.find(ids[0], ids[1])) {
      out.push_back(m->merged);
    } else {
      out.push_back(ids[0]);
      out.push_back(ids[1]);
    }
    return;
  }
  auto& prev = s.prev;
  auto& next = s.next;
  auto& heap = s.heap;
  prev.resize(n);
  next.resize(n);
  heap.clear();
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  auto push = [&](int32_t pos) {
    const int32_t r = next[pos];
    if (r < 0) return;
    if (const auto* m = merges.find(ids[pos], ids[r])) {
      heap.push_back({m->rank, pos, ids[pos], ids[r], m->merged});
      std::push_heap(heap.begin(), heap.end(), after);
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const auto* m = merges.find(ids[i], ids[i + 1])) heap.push_back({m->rank, i, ids[i], ids[i + 1], m->merged});
  }
  std::make_heap(heap.begin(), heap.end(), after);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), after);
    const BpeScratch::Candidate c = heap.back();
    heap.pop_back();
    const int32_t l = c.pos;
    const int32_t r = next[l];
    // ids[l] == -1 marks a symbol that was merged into its left neighbour.
    if (ids[l] != c.left || r < 0 || ids[r] != c.right) continue;
    ids[l] = c.merged;
    ids[r] = -1;
    next[l] = next[r];
    if (next[r] >= 0) prev[next[r]] = l;
    if (prev[l] >= 0) push(prev[l]);
    push(l);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) out.push_back(ids[i]);
}

}  // namespace dspark::tok::detail
