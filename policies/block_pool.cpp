#include "policies/block_pool.h"

#include <stdexcept>

namespace tandem {

BlockPool::BlockPool(int32_t num_blocks) : num_blocks_(num_blocks), num_free_(num_blocks), meta_(1) {
  if (num_blocks < 1) throw std::invalid_argument("BlockPool: needs at least one block");
  meta(kSentinel).prev = meta(kSentinel).next = kSentinel;  // an empty list; every block is fresh
}

void BlockPool::link_after(int32_t pos, int32_t block) {
  const int32_t after = meta(pos).next;
  meta(block).prev = pos;
  meta(block).next = after;
  meta(pos).next = block;
  meta(after).prev = block;
  ++num_free_;
}

void BlockPool::unlink(int32_t block) {
  Meta& m = meta(block);
  meta(m.prev).next = m.next;
  meta(m.next).prev = m.prev;
  m.prev = m.next = kNotListed;
  --num_free_;
}

int32_t BlockPool::allocate() {
  // The list's order, with the fresh blocks where a full list would hold them: unpublished
  // blocks (at the head), then the fresh ones in id order, then the cached ones (LRU first).
  const int32_t head = meta(kSentinel).next;
  if ((head == kSentinel || meta(head).slot != kUnpublished) && num_materialized() < num_blocks_) {
    const int32_t b = num_materialized();
    meta_.emplace_back();
    --num_free_;
    meta(b).ref = 1;
    return b;
  }
  const int32_t b = head;
  if (b == kSentinel)
    throw std::logic_error("BlockPool::allocate: no free block (admission let a request past its reservation)");
  unlink(b);
  // The next head is the next least recently used block, cold in the cache: fetch it (and its
  // index entry) now, while this one is handed out; a request's blocks are taken in a run.
  const Meta& next = meta(meta(kSentinel).next);
  __builtin_prefetch(&next);
  if (next.slot < kPrivate) __builtin_prefetch(slots_.data() + next.slot);  // a private block has no entry
  if (meta(b).slot != kUnpublished) {  // evict: the hash no longer names this block
    if (meta(b).slot == kPrivate) {
      meta(b).slot = kUnpublished;
      --num_private_;
    } else {
      index_erase(b);
    }
    ++evictions_;
  }
  meta(b).ref = 1;
  return b;
}

void BlockPool::touch(int32_t block) {
  if (meta(block).ref++ == 0) unlink(block);
}

void BlockPool::release(int32_t block) {
  Meta& m = meta(block);
  if (m.ref <= 0) throw std::logic_error("BlockPool::release: block is not referenced");
  if (--m.ref > 0) return;
  if (m.slot != kUnpublished)
    link_after(meta(kSentinel).prev, block);  // tail: kept longest
  else
    link_after(kSentinel, block);  // head: reused first
}

bool BlockPool::publish(int32_t block, const BlockHash& h) {
  if (meta(block).slot != kUnpublished) return false;
  if (h == kPrivateBlock) {
    meta(block).slot = kPrivate;
    ++num_private_;
    return true;
  }
  return index_insert(h, block);
}

int32_t BlockPool::find_slot(const BlockHash& h) const {
  const uint32_t tag = tag_of(h);
  for (uint32_t i = tag & mask_;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.block < 0) return -1;
    if (s.tag == tag && meta(s.block).hash == h) return static_cast<int32_t>(i);
  }
}

// A table twice as large, every entry re-inserted at its home run (the blocks' slots move).
void BlockPool::index_grow() {
  std::vector<Slot> old;
  old.swap(slots_);
  const uint32_t cap = old.empty() ? 1024u : 2u * static_cast<uint32_t>(old.size());
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  for (const Slot& s : old) {
    if (s.block < 0) continue;
    uint32_t i = s.tag & mask_;
    while (slots_[i].block >= 0) i = (i + 1) & mask_;
    slots_[i] = s;
    meta(s.block).slot = i;
  }
}

bool BlockPool::index_insert(const BlockHash& h, int32_t block) {
  if (2 * (static_cast<size_t>(num_published_) + 1) > slots_.size()) index_grow();  // load stays <= 1/2
  const uint32_t tag = tag_of(h);
  uint32_t i = tag & mask_;
  for (; slots_[i].block >= 0; i = (i + 1) & mask_)
    if (slots_[i].tag == tag && meta(slots_[i].block).hash == h) return false;  // the first one stays
  slots_[i] = {tag, block};
  meta(block).slot = i;
  meta(block).hash = h;
  ++num_published_;
  return true;
}

void BlockPool::index_erase(int32_t block) {
  uint32_t hole = meta(block).slot;
  if (hole >= kPrivate || slots_[hole].block != block)
    throw std::logic_error("BlockPool: a published block is missing from the index");
  meta(block).slot = kUnpublished;
  // Backward shift: pull later entries of the probe run into the hole unless their home slot
  // lies cyclically in (hole, entry], where moving them would put them before their home.
  for (uint32_t j = (hole + 1) & mask_; slots_[j].block >= 0; j = (j + 1) & mask_) {
    const uint32_t home = slots_[j].tag & mask_;
    if (((j - home) & mask_) >= ((j - hole) & mask_)) {
      slots_[hole] = slots_[j];
      meta(slots_[hole].block).slot = hole;
      hole = j;
    }
  }
  slots_[hole] = Slot{};
  --num_published_;
}

}  // namespace tandem
