// The physical KV blocks, apart from who uses them: per block a reference count and (once
// its KV is complete and it is published) its hash; a hash -> block index for prefix hits;
// and one free list that holds every block nobody references, in eviction order.
//
// The free list is intrusive and doubly linked (prev/next block ids), so a cached block that
// a prefix hit takes back can be unlinked from the middle in O(1) (vLLM v1's
// FreeKVCacheBlockQueue has the same shape). Its head is taken first:
//   - a block with no hash (never published, or a partial last block) is pushed at the head:
//     its content is worthless, so it is reused before any cached block;
//   - a published block is appended at the tail when its last user lets go: the least
//     recently freed cached block is the one evicted (its hash dropped) when a block is needed.
//
// Memory scales with the blocks used, not with the blocks configured: a block gets its record
// when it is first handed out (a fresh pool hands out blocks in id order), and the hash index
// grows with the published blocks. The blocks never handed out sit, implicitly and in id
// order, between the unpublished blocks at the list's head and the cached ones at its tail,
// which is where a fully built list would hold them: allocation order is the same.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "policies/block_hash.h"

namespace tandem {

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t num_free() const { return num_free_; }                        // unreferenced blocks, cached or empty
  int32_t num_cached() const { return num_published_ + num_private_; }  // published, referenced or not
  int64_t num_evictions() const { return evictions_; }
  int32_t ref_count(int32_t block) const { return block < num_materialized() ? meta(block).ref : 0; }
  bool is_published(int32_t block) const { return block < num_materialized() && meta(block).slot != kUnpublished; }
  // Blocks that have a record (handed out at least once): what the pool's memory scales with.
  int32_t num_materialized() const { return static_cast<int32_t>(meta_.size()) - 1; }

  // The block that holds `h`, or -1. No side effect.
  int32_t find(const BlockHash& h) const {
    if (num_published_ == 0) return -1;
    const int32_t s = find_slot(h);
    return s < 0 ? -1 : slots_[static_cast<size_t>(s)].block;
  }

  // A block for new KV, referenced once: the head of the free list. If that block was cached,
  // its hash is dropped (an eviction). Caller checked num_free() > 0.
  int32_t allocate();
  // One more user of a block found by find() (a prefix hit). A block nobody held is taken off
  // the free list, wherever it sits.
  void touch(int32_t block);
  // One user fewer; at zero the block joins the free list (see the header comment).
  void release(int32_t block);
  // A hint: `h` will be published or looked up soon (a run of a prompt's blocks is published
  // together, each at a random slot of a table larger than the L2 cache).
  void prefetch(const BlockHash& h) const {
    if (!slots_.empty() && !(h == kPrivateBlock)) __builtin_prefetch(slots_.data() + (tag_of(h) & mask_));
  }
  // The block's KV is complete: make it findable by `h`. If another block already holds `h`
  // (two requests computed the same prefix at once), this one stays unpublished and the
  // index keeps the first. h == kPrivateBlock: published (cached, LRU) but never findable.
  // Returns whether this block was published.
  bool publish(int32_t block, const BlockHash& h);

 private:
  void unlink(int32_t block);
  void link_after(int32_t pos, int32_t block);  // pos == kSentinel links at the head

  // The hash index: open addressing with linear probing over a power-of-two table of at least
  // twice the published blocks (load <= 1/2; doubled and rehashed before it would pass that), deletion by backward
  // shift (no tombstones, so a long run of evictions never degrades lookups). A slot keeps 32 bits of the hash (its
  // home slot and a quick reject) and the block id; the full hash is compared in hash_. It is a flat array because
  // eviction + publish run once per block in a replay: a node-based map costs an allocation and a cache miss each
  // (the measurement: reports/before-stage4/report.md, "Figures moved from code comments").
  struct Slot {
    uint32_t tag = 0;    // BlockHash::lo's low 32 bits
    int32_t block = -1;  // -1: empty
  };
  static uint32_t tag_of(const BlockHash& h) { return static_cast<uint32_t>(h.lo); }
  int32_t find_slot(const BlockHash& h) const;
  bool index_insert(const BlockHash& h, int32_t block);
  void index_grow();
  void index_erase(int32_t block);

  // Everything about one block in one 32-byte record (two per cache line): with caching on, the
  // block taken from the free list's head is the least recently used one, cold in the cache,
  // and separate arrays would cost a miss each.
  static constexpr uint32_t kUnpublished = ~uint32_t{0};
  static constexpr uint32_t kPrivate = ~uint32_t{0} - 1;  // published, not in the index
  static constexpr int32_t kSentinel = -1;                // the list node before the head and after the tail
  static constexpr int32_t kNotListed = -2;               // prev/next of a block that is not on the free list
  struct Meta {
    BlockHash hash;                                // valid while published
    int32_t prev = kNotListed, next = kNotListed;  // free-list links
    int32_t ref = 0;
    uint32_t slot = kUnpublished;  // its index entry while published
  };
  static_assert(sizeof(Meta) == 32);
  Meta& meta(int32_t b) { return meta_[static_cast<size_t>(b + 1)]; }
  const Meta& meta(int32_t b) const { return meta_[static_cast<size_t>(b + 1)]; }

  int32_t num_blocks_;
  int32_t num_free_ = 0;  // the listed blocks and the blocks never handed out
  int64_t evictions_ = 0;
  std::vector<Meta> meta_;   // [0]: the sentinel; block b at b + 1, for the blocks handed out so far
  std::vector<Slot> slots_;  // allocated at the first publish: a run without caching pays nothing
  uint32_t mask_ = 0;
  int32_t num_published_ = 0;  // in the index
  int32_t num_private_ = 0;    // published as kPrivateBlock
};

}  // namespace tandem
