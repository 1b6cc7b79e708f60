#include "policies/kv_cache.h"

#include <stdexcept>

namespace tandem {

KvCache::KvCache(int32_t num_blocks, int32_t block_size, int32_t num_state_slots, int32_t num_requests)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      num_state_slots_(num_state_slots),
      free_slots_(num_state_slots < 0 ? 0 : num_state_slots),
      free_ring_(static_cast<size_t>(num_blocks)),
      ref_count_(static_cast<size_t>(num_blocks), 0),
      tables_(static_cast<size_t>(num_requests)) {
  if (num_blocks < 1 || block_size < 1) throw std::invalid_argument("KvCache: needs at least one block of at least one token");
  for (int32_t b = 0; b < num_blocks; ++b) free_ring_[static_cast<size_t>(b)] = b;
  free_count_ = num_blocks;
}

int32_t KvCache::pop_free() {
  const int32_t b = free_ring_[static_cast<size_t>(free_head_)];
  free_head_ = free_head_ + 1 == num_blocks_ ? 0 : free_head_ + 1;
  --free_count_;
  ref_count_[static_cast<size_t>(b)] = 1;
  return b;
}

void KvCache::push_free(int32_t block) {
  int32_t tail = free_head_ + free_count_;
  if (tail >= num_blocks_) tail -= num_blocks_;
  free_ring_[static_cast<size_t>(tail)] = block;
  ++free_count_;
}

void KvCache::admit(ReqId id, int64_t lifetime_tokens) {
  Table& t = tables_[static_cast<size_t>(id)];
  if (t.admitted) throw std::logic_error("KvCache::admit: request already admitted");
  t.admitted = true;
  t.reserved = blocks_for(lifetime_tokens);
  t.blocks.reserve(static_cast<size_t>(t.reserved));  // one allocation for the request's whole life
  reserved_remaining_ += t.reserved;
  if (num_state_slots_ >= 0) --free_slots_;
}

void KvCache::grow(ReqId id, int64_t tokens) {
  Table& t = tables_[static_cast<size_t>(id)];
  const int32_t need = blocks_for(tokens);
  if (need > t.reserved) throw std::logic_error("KvCache: request grew past its reservation");
  while (static_cast<int32_t>(t.blocks.size()) < need) {
    t.blocks.push_back(pop_free());
    --reserved_remaining_;
  }
}

void KvCache::release(ReqId id) {
  Table& t = tables_[static_cast<size_t>(id)];
  if (!t.admitted) return;
  for (int32_t b : t.blocks)
    if (--ref_count_[static_cast<size_t>(b)] == 0) push_free(b);
  reserved_remaining_ -= t.reserved - static_cast<int32_t>(t.blocks.size());
  if (num_state_slots_ >= 0) ++free_slots_;
  t = Table{};  // also returns the table's memory: a million finished requests cost nothing here
}

}  // namespace tandem
