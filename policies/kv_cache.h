// KV cache bookkeeping on top of the block pool: per-request block tables, whole-life
// reservations (no preemption, so a request admitted must be able to grow to
// prompt + max_output without ever waiting for memory), and prefix hits.
//
// Reservation accounting is O(1) per query: `reserved_remaining_` is the sum over admitted
// requests of (blocks reserved - blocks held). Appending a block moves one unit from
// "reserved" to "held", so free - reserved_remaining is unchanged by decoding; only
// admission and release move it. The invariant, every step: blocks held by some request
// + reserved_remaining <= num_blocks, i.e. reserved_remaining <= free blocks.
//
// Prefix caching (look before you commit): match_prefix() is a pure query that finds the
// leading blocks of a prompt already in the pool; can_admit() prices them; admit() commits.
// A hit costs no new block, but a hit block that nobody held sits on the free list, and taking
// it off leaves one block fewer for everyone else:
//     need = blocks(lifetime) - hit blocks + hit blocks on the free list  <=  free - reserved
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/request.h"
#include "policies/block_hash.h"
#include "policies/block_pool.h"

namespace tandem {

// The result of match_prefix: the hit blocks in prompt order, and how many of them nobody holds.
struct PrefixHit {
  std::vector<int32_t> blocks;
  int32_t num_free = 0;
  void clear() {
    blocks.clear();
    num_free = 0;
  }
};

constexpr int32_t kDefaultBlockSize = 16;  // tokens per KV block, as vLLM's default

// Blocks of `block_size` tokens that `tokens` positions occupy (the last one partly filled).
inline int32_t blocks_for(int64_t tokens, int32_t block_size) {
  return static_cast<int32_t>((tokens + block_size - 1) / block_size);
}

class KvCache {
 public:
  // num_state_slots < 0: the model has no per-sequence state (pure attention). num_requests:
  // the ids it may see at first (0 .. num_requests - 1); an open run adds more (grow_requests).
  KvCache(int32_t num_blocks, int32_t block_size, int32_t num_state_slots, int32_t num_requests);

  int32_t blocks_for(int64_t tokens) const { return tandem::blocks_for(tokens, block_size_); }

  // ---- pure queries ----
  // Blocks that a new admission may still claim: free minus what running requests will need.
  int32_t headroom() const { return pool_.num_free() - reserved_remaining_; }
  bool can_admit(int64_t lifetime_tokens, const PrefixHit& hit) const {
    const int32_t need = blocks_for(lifetime_tokens) - static_cast<int32_t>(hit.blocks.size()) + hit.num_free;
    return need <= headroom() && (num_state_slots_ < 0 || free_slots_ > 0);
  }
  bool can_admit(int64_t lifetime_tokens) const { return can_admit(lifetime_tokens, PrefixHit{}); }
  // The longest run of leading prompt blocks (at most max_blocks) whose hashes are in the pool.
  // Stops at the first miss: a block's hash chains its parents, so nothing after a miss can hit.
  void match_prefix(std::span<const BlockHash> prompt_hashes, int32_t max_blocks, PrefixHit& out) const;
  // Could this request ever be admitted, on an empty cache?
  bool fits_at_all(int64_t lifetime_tokens) const { return blocks_for(lifetime_tokens) <= num_blocks_; }
  bool has_state_slots() const { return num_state_slots_ != 0; }

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  int32_t free_blocks() const { return pool_.num_free(); }
  int32_t used_blocks() const { return num_blocks_ - pool_.num_free(); }
  int32_t cached_blocks() const { return pool_.num_cached(); }
  int64_t evictions() const { return pool_.num_evictions(); }
  int32_t reserved_remaining() const { return reserved_remaining_; }
  std::span<const int32_t> block_table(ReqId id) const { return tables_[static_cast<size_t>(id)].blocks; }
  int32_t reserved_blocks(ReqId id) const { return tables_[static_cast<size_t>(id)].reserved; }
  const BlockPool& pool() const { return pool_; }

  // ---- mutations ----
  // Reserve blocks(lifetime_tokens) for `id` (and a state slot), starting its table with the hit
  // blocks (from match_prefix on the current state). Caller checked can_admit() with `hit`.
  void admit(ReqId id, int64_t lifetime_tokens, const PrefixHit& hit);
  void admit(ReqId id, int64_t lifetime_tokens) { admit(id, lifetime_tokens, PrefixHit{}); }
  // Grow id's table so it covers `tokens` positions. Stays within the reservation.
  // Inline fast path: most decode steps stay inside the last block.
  void ensure_capacity(ReqId id, int64_t tokens) {
    const Table& t = tables_[static_cast<size_t>(id)];
    if (int64_t(t.blocks.size()) * block_size_ < tokens) grow(id, tokens);
  }
  // id's KV now covers `computed_tokens` positions: publish its full prompt blocks (those with a
  // hash) not yet published, so that later requests can hit them.
  void publish_full_blocks(ReqId id, int64_t computed_tokens, std::span<const BlockHash> prompt_hashes);
  // Ids 0 .. num_requests - 1 may be admitted from now on (never shrinks). Tables move, their
  // block lists do not: a block table view handed out earlier (a plan in flight) stays valid.
  void grow_requests(int32_t num_requests) {
    if (size_t(num_requests) > tables_.size()) tables_.resize(size_t(num_requests));
  }
  // Drop id's blocks (last block first, so a chain's tail is evicted before its root) and the
  // unused part of its reservation; return its state slot.
  void release(ReqId id);

 private:
  struct Table {
    std::vector<int32_t> blocks;
    int32_t reserved = 0;   // blocks reserved for the whole life (held + still to come)
    int32_t published = 0;  // leading blocks already published or hit (known to the pool)
    bool admitted = false;
  };
  void grow(ReqId id, int64_t tokens);

  int32_t num_blocks_, block_size_, num_state_slots_;
  int32_t free_slots_;
  int32_t reserved_remaining_ = 0;
  BlockPool pool_;
  std::vector<Table> tables_;
};

}  // namespace tandem
