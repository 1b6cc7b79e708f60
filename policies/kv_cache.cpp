#include "policies/kv_cache.h"

#include <algorithm>
#include <stdexcept>

namespace tandem {

KvCache::KvCache(int32_t num_blocks, int32_t block_size, int32_t num_state_slots, int32_t num_requests)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      num_state_slots_(num_state_slots),
      free_slots_(num_state_slots < 0 ? 0 : num_state_slots),
      pool_(std::max(num_blocks, 1)),
      tables_(static_cast<size_t>(num_requests)) {
  if (num_blocks < 1 || block_size < 1)
    throw std::invalid_argument("KvCache: needs at least one block of at least one token");
}

void KvCache::match_prefix(std::span<const BlockHash> prompt_hashes, int32_t max_blocks, PrefixHit& out) const {
  out.clear();
  const size_t n = std::min(prompt_hashes.size(), static_cast<size_t>(std::max(max_blocks, 0)));
  for (size_t i = 0; i < n; ++i) {
    if (prompt_hashes[i] == kPrivateBlock) break;  // nobody else's: never cached under a name
    const int32_t b = pool_.find(prompt_hashes[i]);
    if (b < 0) break;
    out.blocks.push_back(b);
    out.num_free += pool_.ref_count(b) == 0;
  }
}

void KvCache::admit(ReqId id, int64_t lifetime_tokens, const PrefixHit& hit) {
  if (static_cast<size_t>(id) >= tables_.size())
    throw std::logic_error("KvCache::admit: a request id beyond its tables (an open run must grow_requests)");
  Table& t = tables_[static_cast<size_t>(id)];
  if (t.admitted) throw std::logic_error("KvCache::admit: request already admitted");
  t.admitted = true;
  t.reserved = blocks_for(lifetime_tokens);
  const auto hits = static_cast<int32_t>(hit.blocks.size());
  if (hits > t.reserved) throw std::logic_error("KvCache::admit: more hit blocks than the request's lifetime");
  t.blocks.reserve(static_cast<size_t>(t.reserved));  // one allocation for the request's whole life
  for (int32_t b : hit.blocks) {
    pool_.touch(b);
    t.blocks.push_back(b);
  }
  t.published = hits;
  reserved_remaining_ += t.reserved - hits;
  if (num_state_slots_ >= 0) --free_slots_;
}

void KvCache::grow(ReqId id, int64_t tokens) {
  Table& t = tables_[static_cast<size_t>(id)];
  const int32_t need = blocks_for(tokens);
  if (need > t.reserved) throw std::logic_error("KvCache: request grew past its reservation");
  while (static_cast<int32_t>(t.blocks.size()) < need) {
    t.blocks.push_back(pool_.allocate());
    --reserved_remaining_;
  }
}

void KvCache::publish_full_blocks(ReqId id, int64_t computed_tokens, std::span<const BlockHash> prompt_hashes) {
  Table& t = tables_[static_cast<size_t>(id)];
  const auto full = static_cast<int32_t>(
      std::min<int64_t>({computed_tokens / block_size_, int64_t(prompt_hashes.size()), int64_t(t.blocks.size())}));
  constexpr int32_t kAhead = 8;  // index entries fetched ahead of their publish
  for (int32_t i = t.published; i < std::min(full, t.published + kAhead); ++i)
    pool_.prefetch(prompt_hashes[static_cast<size_t>(i)]);
  for (; t.published < full; ++t.published) {
    if (t.published + kAhead < full) pool_.prefetch(prompt_hashes[static_cast<size_t>(t.published + kAhead)]);
    pool_.publish(t.blocks[static_cast<size_t>(t.published)], prompt_hashes[static_cast<size_t>(t.published)]);
  }
}

void KvCache::release(ReqId id) {
  Table& t = tables_[static_cast<size_t>(id)];
  if (!t.admitted) return;
  for (auto it = t.blocks.rbegin(); it != t.blocks.rend(); ++it) pool_.release(*it);
  reserved_remaining_ -= t.reserved - static_cast<int32_t>(t.blocks.size());
  if (num_state_slots_ >= 0) ++free_slots_;
  t = Table{};  // also returns the table's memory: a million finished requests cost nothing here
}

}  // namespace tandem
