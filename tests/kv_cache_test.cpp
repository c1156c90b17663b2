// KVCache bookkeeping: full layers grow to hold every position, sliding-window
// layers keep rings bounded by the window and the largest call, rollback
// (trim) is exact while the keys it needs are still in the ring and refused
// once they were overwritten, and growing a ring keeps every live position.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/model/kv_cache.hpp"

namespace {

using dspark::InvalidArgument;
using dspark::KVCache;

constexpr int64_t kHd = 4;

// What a forward call does to a two-layer cache: room for n positions, their
// keys written (every element = the position), the size advanced.
void append(KVCache& c, int64_t n) {
  c.reserve_more(n);
  for (int64_t l = 0; l < 2; ++l)
    for (int64_t p = c.size(); p < c.size() + n; ++p)
      for (int64_t e = 0; e < kHd; ++e) c.keys(l)[(p % c.capacity(l)) * kHd + e] = static_cast<float>(p);
  c.advance(n);
}

// Position p's key is still in layer l's row p % capacity.
bool holds(KVCache& c, int64_t l, int64_t p) { return c.keys(l)[(p % c.capacity(l)) * kHd] == static_cast<float>(p); }

TEST(KVCacheRing, WindowLayersStayBoundedFullLayersGrow) {
  KVCache c(2, 1, kHd, 1000, {0, 4});  // layer 0 full, layer 1 window 4
  EXPECT_EQ(c.window(0), 0);
  EXPECT_EQ(c.window(1), 4);
  for (int i = 0; i < 300; ++i) append(c, 1);
  EXPECT_EQ(c.size(), 300);
  EXPECT_GE(c.capacity(0), 300);
  EXPECT_EQ(c.capacity(1), 4 - 1 + 64);
  for (int64_t p = 0; p < 300; ++p) ASSERT_TRUE(holds(c, 0, p)) << p;
  for (int64_t p = 300 - 67; p < 300; ++p) ASSERT_TRUE(holds(c, 1, p)) << p;
  EXPECT_LT(c.bytes(), 2 * (512 + 67) * kHd * 4 + 1);
}

TEST(KVCacheRing, TrimIsExactWhileTheKeysAreThereAndRefusedAfter) {
  KVCache c(2, 1, kHd, 1000, {0, 4});
  for (int i = 0; i < 100; ++i) append(c, 1);  // ring of 67 rows holds positions 33..99
  c.trim(60);                                  // position 40 attends to 37..40: still held
  EXPECT_EQ(c.size(), 40);
  append(c, 5);
  for (int64_t p = 37; p < 45; ++p) EXPECT_TRUE(holds(c, 1, p)) << p;
  try {
    c.trim(15);  // position 30 would attend to 27..30, overwritten by positions 94..97
    FAIL() << "an impossible rollback was accepted";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("sliding window 4"), std::string::npos) << msg;
    EXPECT_NE(msg.find("position 27"), std::string::npos) << msg;
  }
  EXPECT_EQ(c.size(), 45) << "a refused trim changes nothing";
  c.clear();
  EXPECT_EQ(c.size(), 0);
  append(c, 3);
  EXPECT_TRUE(holds(c, 1, 0));
}

// A call of T tokens always leaves room to roll the whole call back, however
// the ring had wrapped before.
TEST(KVCacheRing, AnyCallCanBeRolledBack) {
  KVCache c(2, 1, kHd, 5000, {0, 16});
  for (int i = 0; i < 200; ++i) append(c, 1);
  for (int64_t T : {1, 7, 33, 64, 65, 150, 9}) {
    const int64_t before = c.size();
    append(c, T);
    EXPECT_GE(c.capacity(1), 16 - 1 + T);
    EXPECT_NO_THROW(c.trim(T)) << T;
    for (int64_t p = before - 15; p < before; ++p) ASSERT_TRUE(holds(c, 1, p)) << "T=" << T << " position " << p;
    append(c, 1);
  }
}

// Growing a ring (a longer call than before) moves every live position to its
// row in the larger ring.
TEST(KVCacheRing, GrowingKeepsLivePositions) {
  KVCache c(2, 1, kHd, 5000, {0, 8});
  for (int i = 0; i < 90; ++i) append(c, 1);
  const int64_t small = c.capacity(1);
  EXPECT_EQ(small, 8 - 1 + 64);
  c.reserve_more(120);
  EXPECT_EQ(c.capacity(1), 8 - 1 + 120);
  for (int64_t p = 90 - small; p < 90; ++p) ASSERT_TRUE(holds(c, 1, p)) << p;
  for (int64_t p = 0; p < 90; ++p) ASSERT_TRUE(holds(c, 0, p)) << p;
}

TEST(KVCacheRing, RejectsBadGeometry) {
  EXPECT_THROW(KVCache(2, 1, kHd, 100, {0}), InvalidArgument);
  EXPECT_THROW(KVCache(2, 1, kHd, 100, {0, -1}), InvalidArgument);
  KVCache c(2, 1, kHd, 10, {4, 0});
  append(c, 10);
  EXPECT_THROW(c.reserve_more(1), InvalidArgument);
  EXPECT_LE(c.capacity(0), 10) << "never more rows than the context";
}

}  // namespace
