#include "sim/workload/prefix_bound.h"

#include <algorithm>

#include "policies/block_hash.h"
#include "policies/kv_cache.h"
#include "policies/scheduler.h"
#include "sim/workload/prompt_hashes.h"

namespace tandem {

namespace {
// The hashes seen so far: open addressing with linear probing, 16 bytes a slot, at most 3/4
// full (a Mooncake hour has millions of distinct 16-token blocks; node-based sets cost 2.5x).
// {0, 0} marks an empty slot; a real hash equal to it is kept aside.
class SeenSet {
 public:
  SeenSet() : slots_(1 << 16) {}
  bool contains(const BlockHash& h) const {
    if (h == BlockHash{}) return has_zero_;
    for (size_t i = slot(h);; i = (i + 1) & mask()) {
      if (slots_[i] == h) return true;
      if (slots_[i] == BlockHash{}) return false;
    }
  }
  void insert(const BlockHash& h) {
    if (h == BlockHash{}) {
      has_zero_ = true;
      return;
    }
    if ((size_ + 1) * 4 > slots_.size() * 3) grow();
    if (place(slots_, h)) ++size_;
  }

 private:
  size_t mask() const { return slots_.size() - 1; }
  size_t slot(const BlockHash& h) const { return static_cast<size_t>(h.lo) & mask(); }
  static bool place(std::vector<BlockHash>& s, const BlockHash& h) {
    for (size_t i = static_cast<size_t>(h.lo) & (s.size() - 1);; i = (i + 1) & (s.size() - 1)) {
      if (s[i] == h) return false;
      if (s[i] == BlockHash{}) {
        s[i] = h;
        return true;
      }
    }
  }
  void grow() {
    std::vector<BlockHash> bigger(slots_.size() * 2);
    for (const BlockHash& h : slots_)
      if (!(h == BlockHash{})) place(bigger, h);
    slots_.swap(bigger);
  }

  std::vector<BlockHash> slots_;
  size_t size_ = 0;
  bool has_zero_ = false;
};
}  // namespace

PrefixBound prefix_bound(const Workload& w, const RequestSet& set) {
  PrefixBound b;
  const int32_t bs = w.engine.block_size;
  b.block_size = bs;
  b.hit_blocks_by_request.assign(set.requests.size(), 0);
  const PromptTokens tokens(w.seed, w.model.vocab, set);
  const BlockHash root = root_block_hash(w);
  SeenSet seen;
  std::vector<BlockHash> hashes;
  // The run's own arrival checks (a KV cache makes a block's record only when it hands it out).
  KvCache kv(w.engine.resolved_kv_blocks, bs, w.engine.state_slots, 0);
  const Scheduler arrivals(scheduler_config(w), {}, kv);
  for (const Request& r : set.requests) {  // arrival order (ids are assigned by arrival)
    if (r.prompt_len < 1) continue;
    ++b.requests;
    b.queried_blocks += r.prompt_len / bs;
    b.queried_tokens += r.prompt_len;
    if (arrivals.arrival_failure(r) != FailReason::None) continue;
    ++b.servable_requests;
    b.servable_queried_tokens += r.prompt_len;
    hash_prompt_blocks(r, tokens, bs, root, hashes);
    const size_t cap = std::min(hashes.size(), static_cast<size_t>((r.prompt_len - 1) / bs));
    // Leading blocks seen before. A chained hash names its whole prefix, so the first miss ends
    // the run, and every block after it is new too: only those are inserted.
    size_t lead = 0;
    while (lead < hashes.size() && !(hashes[lead] == kPrivateBlock) && seen.contains(hashes[lead])) ++lead;
    for (size_t i = lead; i < hashes.size() && !(hashes[i] == kPrivateBlock); ++i) seen.insert(hashes[i]);
    const auto hit = static_cast<int32_t>(std::min(lead, cap));
    b.hit_blocks_by_request[static_cast<size_t>(r.id)] = hit;
    b.requests_hit += hit > 0;
    b.hit_blocks += hit;
  }
  b.hit_tokens = b.hit_blocks * bs;
  return b;
}

}  // namespace tandem
