// The block pool (policies/block_pool): allocation order, ref counts, the LRU free list, the hash index.
#include <doctest/doctest.h>

#include <stdexcept>
#include <vector>

#include "core/rng.h"
#include "policies/block_pool.h"
#include "policies/scheduler.h"
#include "tests/policies_helpers.h"

using namespace tandem;
using namespace tandem::testing;

TEST_CASE("block pool: a fresh pool hands out blocks in id order; misuse throws") {
  BlockPool p(3);
  CHECK(p.num_free() == 3);
  CHECK(p.allocate() == 0);
  CHECK(p.allocate() == 1);
  CHECK(p.allocate() == 2);
  CHECK(p.num_free() == 0);
  CHECK_THROWS_AS(p.allocate(), std::logic_error);
  for (int32_t b = 0; b < 3; ++b) CHECK(p.ref_count(b) == 1);
  p.release(1);
  CHECK(p.ref_count(1) == 0);
  CHECK_THROWS_AS(p.release(1), std::logic_error);  // not referenced any more
  CHECK_THROWS_AS(BlockPool(0), std::invalid_argument);
}

TEST_CASE("block pool: cached blocks are evicted least recently freed first; empty blocks go before any cached one") {
  BlockPool p(5);
  for (int32_t b = 0; b < 5; ++b) REQUIRE(p.allocate() == b);
  for (int32_t b = 0; b < 3; ++b) CHECK(p.publish(b, H(uint64_t(b))));
  CHECK(p.num_cached() == 3);
  p.release(2);  // cached: tail     free: 2
  p.release(0);  // cached: tail     free: 2 0
  p.release(3);  // empty: head      free: 3 2 0
  p.release(1);  // cached: tail     free: 3 2 0 1
  p.release(4);  // empty: head      free: 4 3 2 0 1
  CHECK(p.num_free() == 5);
  CHECK(p.num_cached() == 3);  // freed, still findable
  CHECK(p.find(H(0)) == 0);
  CHECK(p.num_evictions() == 0);
  CHECK(p.allocate() == 4);
  CHECK(p.allocate() == 3);
  CHECK(p.num_evictions() == 0);  // empty blocks cost no eviction
  CHECK(p.allocate() == 2);       // the least recently freed cached block
  CHECK(p.num_evictions() == 1);
  CHECK(p.find(H(2)) == -1);  // its hash is dropped...
  CHECK_FALSE(p.is_published(2));
  CHECK(p.find(H(0)) == 0);  // ... and only its
  CHECK(p.num_cached() == 2);
  CHECK(p.allocate() == 0);
  CHECK(p.allocate() == 1);
  CHECK(p.num_evictions() == 3);
  CHECK(p.num_cached() == 0);
  // An evicted block, reused and released unpublished, goes to the head like any empty block.
  CHECK(p.publish(0, H(7)));
  p.release(0);  // cached: free: 0
  p.release(2);  // empty:  free: 2 0
  CHECK(p.allocate() == 2);
  CHECK(p.num_evictions() == 3);
  CHECK(p.allocate() == 0);
  CHECK(p.num_evictions() == 4);
}

TEST_CASE("block pool: touch takes a cached block back from the middle of the free list") {
  BlockPool p(5);
  for (int32_t b = 0; b < 5; ++b) REQUIRE(p.allocate() == b);
  for (int32_t b = 0; b < 5; ++b) CHECK(p.publish(b, H(uint64_t(b))));
  for (int32_t b = 0; b < 5; ++b) p.release(b);  // free: 0 1 2 3 4
  CHECK(p.find(H(2)) == 2);
  p.touch(2);  // a prefix hit on a block nobody held: off the free list, still cached
  CHECK(p.num_free() == 4);
  CHECK(p.ref_count(2) == 1);
  p.touch(2);  // a second user of a held block: nothing moves
  CHECK(p.num_free() == 4);
  CHECK(p.ref_count(2) == 2);
  p.touch(4);  // the tail
  p.touch(0);  // the head
  CHECK(p.num_free() == 2);
  CHECK(drain_free_list(p) == std::vector<int32_t>{1, 3});
  CHECK(p.num_evictions() == 2);
  CHECK(p.find(H(2)) == 2);  // never on the list while held: never evicted
  p.release(2);
  CHECK(p.num_free() == 0);  // one user left
  p.release(4);
  p.release(2);  // now free: 4 2 (the tail, in release order)
  p.release(0);  //           4 2 0
  CHECK(p.num_free() == 3);
  CHECK(drain_free_list(p) == std::vector<int32_t>{4, 2, 0});
  CHECK(p.num_evictions() == 5);
  CHECK(p.num_cached() == 0);
}

TEST_CASE("block pool: publishing a hash twice keeps the first block; the loser stays an empty block") {
  BlockPool p(4);
  const int32_t a = p.allocate(), b = p.allocate();
  CHECK(p.publish(a, H(1)));
  CHECK_FALSE(p.publish(b, H(1)));  // same prefix computed twice at once: the index keeps the first
  CHECK(p.find(H(1)) == a);
  CHECK_FALSE(p.is_published(b));
  CHECK(p.num_cached() == 1);
  CHECK_FALSE(p.publish(a, H(2)));  // a block is published once, under one hash
  CHECK(p.find(H(2)) == -1);
  p.release(a);  // tail
  p.release(b);  // unpublished: head, reused before the cached block and the never-used ones
  CHECK(p.allocate() == b);
  CHECK(p.allocate() == 2);
  CHECK(p.allocate() == 3);
  CHECK(p.num_evictions() == 0);
  CHECK(p.allocate() == a);
  CHECK(p.num_evictions() == 1);
  CHECK(p.find(H(1)) == -1);
  CHECK(p.publish(b, H(1)));  // the hash is free again
  CHECK(p.find(H(1)) == b);
}

TEST_CASE("block pool: memory follows the blocks handed out, not the blocks configured") {
  BlockPool p(1 << 27);  // 134M blocks: a full table of records would be 4 GB
  CHECK(p.num_materialized() == 0);
  CHECK(p.num_free() == (1 << 27));
  std::vector<int32_t> got;
  for (int i = 0; i < 10; ++i) got.push_back(p.allocate());
  CHECK(got == std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});  // id order, as a full list
  CHECK(p.num_materialized() == 10);
  CHECK(p.ref_count(5) == 1);
  CHECK(p.ref_count(1 << 26) == 0);  // never handed out: free, no record
  CHECK_FALSE(p.is_published(1 << 26));
  // An unpublished block freed goes before the fresh ones; a published one after them.
  REQUIRE(p.publish(3, H(3)));
  p.release(3);
  p.release(7);
  CHECK(p.allocate() == 7);
  CHECK(p.allocate() == 10);  // fresh, before the cached block 3
  CHECK(p.num_materialized() == 11);
}

TEST_CASE("block pool: the index grows with the published blocks and finds every one after a rehash") {
  BlockPool p(100000);
  for (int32_t b = 0; b < 5000; ++b) {
    REQUIRE(p.allocate() == b);
    REQUIRE(p.publish(b, H(uint64_t(b) + 1)));
  }
  for (int32_t b = 0; b < 5000; ++b) REQUIRE(p.find(H(uint64_t(b) + 1)) == b);
  CHECK(p.find(H(999999)) == -1);
}

TEST_CASE("block pool: allocating when a private block is next in line reads no index entry") {
  // Regression: allocate() prefetched slots_[next.slot] also for a private block (slot
  // 0xFFFFFFFE) on an empty index; -D_GLIBCXX_ASSERTIONS (the sanitizer build) aborted here.
  BlockPool p(3);
  const int32_t a = p.allocate(), b = p.allocate(), c = p.allocate();
  REQUIRE(p.publish(a, kPrivateBlock));
  REQUIRE(p.publish(b, kPrivateBlock));
  p.release(a);
  p.release(b);              // free list: a, b (both private, cached)
  CHECK(p.allocate() == a);  // evicts a; b is next in line
  CHECK(p.num_evictions() == 1);
  p.release(c);
  CHECK(p.num_cached() == 1);
}
