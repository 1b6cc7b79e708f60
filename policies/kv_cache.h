// KV cache bookkeeping: a pool of fixed-size blocks with reference counts, per-request
// block tables, and whole-life reservations (no preemption, so a request admitted must
// be able to grow to prompt + max_output without ever waiting for memory).
//
// Reservation accounting is O(1) per query: `reserved_remaining_` is the sum over admitted
// requests of (blocks reserved - blocks held). Appending a block moves one unit from
// "reserved" to "held", so free - reserved_remaining is unchanged by decoding; only
// admission and release move it.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "sim/request.h"

namespace tandem {

class KvCache {
 public:
  // num_state_slots < 0: the model has no per-sequence state (pure attention).
  KvCache(int32_t num_blocks, int32_t block_size, int32_t num_state_slots, int32_t num_requests);

  int32_t blocks_for(int64_t tokens) const {
    return static_cast<int32_t>((tokens + block_size_ - 1) / block_size_);
  }

  // ---- pure queries ----
  // Blocks that a new admission may still claim: free minus what running requests will need.
  int32_t headroom() const { return free_count_ - reserved_remaining_; }
  bool can_admit(int64_t lifetime_tokens) const {
    return blocks_for(lifetime_tokens) <= headroom() && (num_state_slots_ < 0 || free_slots_ > 0);
  }
  // Could this request ever be admitted, on an empty cache?
  bool fits_at_all(int64_t lifetime_tokens) const { return blocks_for(lifetime_tokens) <= num_blocks_; }
  bool has_state_slots() const { return num_state_slots_ != 0; }

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  int32_t free_blocks() const { return free_count_; }
  int32_t used_blocks() const { return num_blocks_ - free_count_; }
  int32_t reserved_remaining() const { return reserved_remaining_; }
  int32_t free_state_slots() const { return free_slots_; }
  std::span<const int32_t> block_table(ReqId id) const { return tables_[id].blocks; }
  int32_t reserved_blocks(ReqId id) const { return tables_[id].reserved; }

  // ---- mutations ----
  // Reserve blocks(lifetime_tokens) for `id` (and a state slot). Caller checked can_admit().
  void admit(ReqId id, int64_t lifetime_tokens);
  // Grow id's table so it covers `tokens` positions. Stays within the reservation.
  // Inline fast path: most decode steps stay inside the last block.
  void ensure_capacity(ReqId id, int64_t tokens) {
    const Table& t = tables_[static_cast<size_t>(id)];
    if (int64_t(t.blocks.size()) * block_size_ < tokens) grow(id, tokens);
  }
  // Drop id's blocks and the unused part of its reservation; return its state slot.
  void release(ReqId id);

 private:
  struct Table {
    std::vector<int32_t> blocks;
    int32_t reserved = 0;  // blocks reserved for the whole life (held + still to come)
    bool admitted = false;
  };
  void grow(ReqId id, int64_t tokens);
  int32_t pop_free();
  void push_free(int32_t block);

  int32_t num_blocks_, block_size_, num_state_slots_;
  int32_t free_slots_;
  int32_t reserved_remaining_ = 0;
  // Free blocks: FIFO ring, so a freed block is reused as late as possible (prefix caching
  // will rely on that: a freed cached block stays findable until it is reused).
  std::vector<int32_t> free_ring_;
  int32_t free_head_ = 0, free_count_ = 0;
  std::vector<int32_t> ref_count_;
  std::vector<Table> tables_;
};

}  // namespace tandem
