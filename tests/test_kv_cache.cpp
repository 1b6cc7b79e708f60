// The KV cache (policies/kv_cache): reservations at block boundaries, state slots, prefix matching.
#include <doctest/doctest.h>

#include <stdexcept>
#include <vector>

#include "core/rng.h"
#include "policies/block_pool.h"
#include "policies/scheduler.h"
#include "tests/policies_helpers.h"

using namespace tandem;
using namespace tandem::testing;

TEST_CASE("blocks_for rounds up at block boundaries") {
  KvCache kv(10, 16, -1, 1);
  CHECK(kv.blocks_for(0) == 0);
  CHECK(kv.blocks_for(1) == 1);
  CHECK(kv.blocks_for(16) == 1);
  CHECK(kv.blocks_for(17) == 2);
  CHECK(kv.blocks_for(32) == 2);
  CHECK(kv.blocks_for(33) == 3);
}

TEST_CASE("reservation: a lifetime of exactly the free blocks is admitted, one token more is not") {
  KvCache kv(4, 16, -1, 3);
  CHECK(kv.can_admit(64));  // 4 blocks
  CHECK_FALSE(kv.can_admit(65));
  kv.admit(0, 33);  // 3 blocks reserved, none held yet
  CHECK(kv.headroom() == 1);
  CHECK(kv.reserved_remaining() == 3);
  CHECK(kv.can_admit(16));
  CHECK_FALSE(kv.can_admit(17));
  // Growing within the reservation leaves the headroom unchanged.
  kv.ensure_capacity(0, 17);
  CHECK(kv.used_blocks() == 2);
  CHECK(kv.reserved_remaining() == 1);
  CHECK(kv.headroom() == 1);
  kv.ensure_capacity(0, 33);
  CHECK(kv.headroom() == 1);
  CHECK_THROWS(kv.ensure_capacity(0, 49));  // past its reservation: a bug, not a wait
  kv.release(0);
  CHECK(kv.free_blocks() == 4);
  CHECK(kv.reserved_remaining() == 0);
  CHECK(kv.headroom() == 4);
}

TEST_CASE("release of a partly grown request returns the unused reservation") {
  KvCache kv(8, 4, -1, 2);
  kv.admit(0, 20);           // 5 blocks
  kv.ensure_capacity(0, 5);  // 2 held, 3 outstanding
  CHECK(kv.headroom() == 3);
  kv.release(0);
  CHECK(kv.headroom() == 8);
  CHECK(kv.free_blocks() == 8);
}

TEST_CASE("freed blocks (never published) are reused first, in their table's order") {
  // Stage 3's free list: a block without a hash goes back to the head (its content is worth
  // nothing), and a table is released last block first, so the head is again its first block.
  KvCache kv(6, 1, -1, 3);
  kv.admit(0, 2);
  kv.ensure_capacity(0, 2);  // blocks 0, 1
  kv.admit(1, 2);
  kv.ensure_capacity(1, 2);  // blocks 2, 3; free list: 4 5
  kv.release(0);             // free list: 0 1 4 5
  kv.admit(2, 3);
  kv.ensure_capacity(2, 3);
  auto t = kv.block_table(2);
  CHECK(std::vector<int32_t>(t.begin(), t.end()) == std::vector<int32_t>{0, 1, 4});
  CHECK(kv.evictions() == 0);
}

TEST_CASE("state slots: admission stops when they run out, release returns one") {
  KvCache kv(100, 16, 1, 2);
  CHECK(kv.can_admit(10));
  kv.admit(0, 10);
  CHECK_FALSE(kv.can_admit(10));
  kv.release(0);
  CHECK(kv.can_admit(10));
}

TEST_CASE("kv cache: match_prefix is a pure query; it stops at the first miss and at max_blocks") {
  KvCache kv(8, 4, -1, 3);
  kv.admit(0, 13);  // 4 blocks
  kv.ensure_capacity(0, 12);
  const auto h0 = hashes({10, 11, 12});
  kv.publish_full_blocks(0, 12, h0);
  CHECK(kv.cached_blocks() == 3);
  kv.release(0);  // 0 1 2 cached (tail, last first: 2 1 0), 3 empty (head)
  const int32_t free0 = kv.free_blocks(), used0 = kv.used_blocks(), cached0 = kv.cached_blocks();
  PrefixHit hit;
  hit.blocks = {99};
  hit.num_free = 7;
  const auto q = hashes({10, 11, 12, 13});
  kv.match_prefix(q, 10, hit);
  CHECK(hit.blocks == std::vector<int32_t>{0, 1, 2});
  CHECK(hit.num_free == 3);
  PrefixHit again;
  kv.match_prefix(q, 10, again);  // nothing moved: the same answer
  CHECK(again.blocks == hit.blocks);
  CHECK(kv.free_blocks() == free0);
  CHECK(kv.used_blocks() == used0);
  CHECK(kv.cached_blocks() == cached0);
  for (int32_t b = 0; b < 3; ++b) CHECK(kv.pool().ref_count(b) == 0);
  kv.match_prefix(q, 2, hit);
  CHECK(hit.blocks == std::vector<int32_t>{0, 1});
  kv.match_prefix(q, 0, hit);
  CHECK(hit.blocks.empty());
  CHECK(hit.num_free == 0);
  kv.match_prefix(hashes({10, 99, 12}), 10, hit);  // a miss ends the run, even if later hashes are known
  CHECK(hit.blocks == std::vector<int32_t>{0});
  // Held blocks count as hits but not as free ones.
  kv.admit(1, 9, PrefixHit{{0}, 1});
  kv.match_prefix(q, 10, hit);
  CHECK(hit.blocks == std::vector<int32_t>{0, 1, 2});
  CHECK(hit.num_free == 2);
  kv.release(1);
  CHECK(kv.used_blocks() == 0);
}

TEST_CASE("kv cache: can_admit prices hit blocks that sit on the free list") {
  KvCache kv(6, 4, -1, 5);
  kv.admit(0, 8);
  kv.ensure_capacity(0, 8);  // blocks 0, 1
  kv.publish_full_blocks(0, 8, hashes({1, 2}));
  kv.release(0);  // free: 2 3 4 5 1 0 (cached ones at the tail, last block first)
  CHECK(kv.free_blocks() == 6);
  CHECK(kv.cached_blocks() == 2);
  kv.admit(1, 9);  // 3 blocks reserved, none held: headroom 3
  REQUIRE(kv.headroom() == 3);
  PrefixHit hit;
  kv.match_prefix(hashes({1, 2, 3}), 10, hit);
  REQUIRE(hit.blocks == std::vector<int32_t>{0, 1});
  REQUIRE(hit.num_free == 2);
  // 4 blocks of life, 2 of them hits, but both hits leave the free list: 4 - 2 + 2 = 4 > 3.
  CHECK_FALSE(kv.can_admit(16, hit));
  CHECK(kv.can_admit(12, hit));  // 3 - 2 + 2 = 3
  kv.admit(2, 12, hit);
  CHECK(vec(kv.block_table(2)) == std::vector<int32_t>{0, 1});
  CHECK(kv.free_blocks() == 4);
  CHECK(kv.reserved_remaining() == 3 + 1);
  CHECK(kv.headroom() == 0);
  CHECK(kv.used_blocks() + kv.reserved_remaining() <= kv.num_blocks());
  // The same hit again: now held, so free of charge beyond the blocks still to come.
  kv.match_prefix(hashes({1, 2}), 10, hit);
  CHECK(hit.num_free == 0);
  CHECK(kv.can_admit(8, hit));        // 2 - 2 + 0 = 0
  CHECK_FALSE(kv.can_admit(9, hit));  // 3 - 2 + 0 = 1 > 0
  kv.admit(3, 8, hit);
  CHECK(kv.pool().ref_count(0) == 2);
  CHECK(kv.pool().ref_count(1) == 2);
  // Growing past the hits takes the head of the free list (empty blocks first) within the reservation.
  kv.ensure_capacity(2, 12);
  CHECK(vec(kv.block_table(2)) == std::vector<int32_t>{0, 1, 2});
  CHECK(kv.headroom() == 0);
  kv.release(3);
  kv.release(2);
  kv.release(1);
  CHECK(kv.used_blocks() == 0);
  CHECK(kv.reserved_remaining() == 0);
  CHECK(kv.cached_blocks() == 2);
  CHECK(kv.evictions() == 0);
}

TEST_CASE("kv cache: publish_full_blocks publishes each full prompt block once, in order, up to what is computed") {
  KvCache kv(10, 4, -1, 2);
  const auto h = hashes({1, 2, 3});  // a 14-token prompt: 3 full blocks
  kv.admit(0, 20);
  kv.ensure_capacity(0, 6);
  kv.publish_full_blocks(0, 6, h);  // 1 full block computed
  CHECK(kv.cached_blocks() == 1);
  CHECK(kv.pool().find(H(1)) == 0);
  kv.ensure_capacity(0, 14);
  kv.publish_full_blocks(0, 8, h);  // the table reaches further; only what is computed counts
  CHECK(kv.cached_blocks() == 2);
  kv.publish_full_blocks(0, 14, h);
  CHECK(kv.cached_blocks() == 3);
  kv.ensure_capacity(0, 20);
  kv.publish_full_blocks(0, 20, h);  // past the prompt: no hash, nothing more
  CHECK(kv.cached_blocks() == 3);
  CHECK_FALSE(kv.pool().is_published(3));
  // A second request that computed the same blocks itself (no hit): the first one wins.
  kv.admit(1, 8);
  kv.ensure_capacity(1, 8);
  kv.publish_full_blocks(1, 8, h);
  CHECK(kv.cached_blocks() == 3);
  CHECK(kv.pool().find(H(1)) == 0);
  CHECK_FALSE(kv.pool().is_published(kv.block_table(1)[0]));
  kv.release(1);
  kv.release(0);
  CHECK(kv.used_blocks() == 0);
}

TEST_CASE("kv cache: random admit / grow / publish / release keep held + reserved <= capacity and leak nothing") {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    Rng rng(seed);
    const int32_t n = int32_t(rng.uniform_int(2, 24)), bs = int32_t(rng.uniform_int(1, 4));
    KvCache kv(n, bs, -1, 64);
    std::vector<int64_t> life(64, 0), grown(64, 0);
    std::vector<std::vector<BlockHash>> hs(64);
    std::vector<ReqId> live;
    ReqId next = 0;
    for (int op = 0; op < 300; ++op) {
      const double u = rng.uniform();
      if (u < 0.35 && next < 64) {
        const ReqId id = next++;
        const uint64_t group = uint64_t(rng.uniform_int(0, 2));
        const int64_t prompt = rng.uniform_int(1, n * bs);
        for (int64_t b = 0; b < prompt / bs; ++b) hs[size_t(id)].push_back(H(group * 1000 + uint64_t(b)));
        PrefixHit hit;
        kv.match_prefix(hs[size_t(id)], int32_t((prompt - 1) / bs), hit);
        const int64_t lifetime = prompt + rng.uniform_int(1, 8);
        if (!kv.can_admit(lifetime, hit)) continue;
        kv.admit(id, lifetime, hit);
        life[size_t(id)] = lifetime;
        grown[size_t(id)] = int64_t(hit.blocks.size()) * bs;
        live.push_back(id);
      } else if (u < 0.8 && !live.empty()) {
        const ReqId id = live[size_t(rng.uniform_int(0, int64_t(live.size()) - 1))];
        auto& g = grown[size_t(id)];
        g = std::min(life[size_t(id)], g + rng.uniform_int(1, 2 * bs));
        kv.ensure_capacity(id, g);
        kv.publish_full_blocks(id, g, hs[size_t(id)]);
      } else if (!live.empty()) {
        const size_t k = size_t(rng.uniform_int(0, int64_t(live.size()) - 1));
        kv.release(live[k]);
        live.erase(live.begin() + int64_t(k));
      }
      REQUIRE(kv.headroom() >= 0);
      REQUIRE(kv.used_blocks() + kv.reserved_remaining() <= kv.num_blocks());
      int32_t reserved = 0;
      for (ReqId id : live) reserved += kv.reserved_blocks(id) - int32_t(kv.block_table(id).size());
      REQUIRE(kv.reserved_remaining() == reserved);
    }
    for (ReqId id : live) kv.release(id);
    CHECK(kv.used_blocks() == 0);
    CHECK(kv.reserved_remaining() == 0);
    CHECK(kv.free_blocks() == n);
  }
}
