// A deliberately naive scheduler for differential testing: the same policy as
// policies/scheduler.cpp, written the obvious way. It recomputes free blocks and every
// running request's outstanding reservation for each admission candidate, keeps block
// tables in a std::map, the free list in a std::list searched linearly, and the prefix
// cache's index in a std::map searched by value to tell whether a block is published.
// Slow on purpose; shares no code with the real scheduler beyond the plain
// Request/StepPlan/BlockHash structs.
//
// The rules it follows (stage 3, prefix caching):
//   free list   starts as 0..N-1 (0 first). A new block is the first of the list; if it was
//               published its hash is dropped (an eviction). A request that leaves lets go
//               of its blocks last first; a block nobody references any more goes to the
//               back of the list if it is published (LRU of cached blocks), to the front if
//               not (its content is worthless: reused before any cached block).
//   publishing  after a step, for each planned seq that was in its prompt before it: the
//               table's blocks [published, min(computed / bs, #hashes, table size)) are
//               published in order, unless their hash is already known (first one wins).
//               All of this before any request of that step leaves.
//   admission   the head's hit: the longest run of leading hashes in the index, at most
//               (prompt_len - 1) / bs blocks; it costs blocks(lifetime) - hits + (hit blocks
//               that nobody references, since taking them off the free list removes them
//               from everyone's headroom). The request starts with num_computed = hits * bs.
#pragma once
#include <algorithm>
#include <list>
#include <map>
#include <utility>
#include <vector>

#include "core/request.h"
#include "policies/block_hash.h"
#include "policies/plan.h"

namespace tandem::testing {

struct RefConfig {
  bool static_batching = false;
  int max_num_seqs = 1, budget = 1, max_model_len = 1 << 30;
  int num_blocks = 1, block_size = 16, state_slots = -1;
  bool chunked = false;  // chunked prefill
  int max_partials = 1;  // prompts part-way at once after a step
  bool prefix_caching = false;
  bool prompts_or_decodes = false;  // step composition (unchunked only): a step runs prompts, or decodes
};

struct RefSeq {
  ReqId id;
  int num_tokens, num_computed_before;
  bool samples;
  std::vector<int> blocks;
  bool operator==(const RefSeq&) const = default;
};

// What happened in the cache, for coverage reports.
struct RefCounters {
  long hit_blocks = 0;           // blocks taken from the cache at admission
  long hit_free_blocks = 0;      // ... of which nobody referenced (taken off the free list)
  long hit_admissions = 0;       // admissions with at least one hit block
  long capped_hits = 0;          // admissions whose hit stopped at the (prompt_len - 1) / bs cap
  long published = 0;            // blocks published
  long duplicate_publishes = 0;  // blocks not published because their hash was already known
  long evictions = 0;
  long refused_for_free_hits = 0;  // admissions refused only because hit blocks were on the free list
};

class ReferenceScheduler {
 public:
  ReferenceScheduler(RefConfig c, std::vector<Request>& reqs) : c_(c), reqs_(reqs) {
    for (int b = 0; b < c.num_blocks; ++b) free_.push_back(b);
  }

  static int ceil_div(long a, long b) { return int((a + b - 1) / b); }

  bool add(ReqId id, std::vector<BlockHash> prompt_hashes = {}) {
    Request& r = reqs_[id];
    const long life = long(r.prompt_len) + r.max_output;
    if (r.prompt_len < 1 || r.max_output < 1 || life > c_.max_model_len ||
        ceil_div(life, c_.block_size) > c_.num_blocks || (!c_.chunked && r.prompt_len > c_.budget) ||
        c_.state_slots == 0) {
      r.status = RequestStatus::Failed;
      return false;
    }
    r.status = RequestStatus::Waiting;
    waiting_.push_back(id);
    if (c_.prefix_caching) hashes_[id] = std::move(prompt_hashes);
    return true;
  }

  bool cancel(ReqId id) {
    Request& r = reqs_[id];
    if (r.status == RequestStatus::Waiting) {
      waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
      r.status = RequestStatus::Cancelled;
      return true;
    }
    if (r.status != RequestStatus::Running) return false;
    if (in_flight_) {
      pending_cancel_.push_back(id);
      return false;
    }
    free_request(id);
    running_.erase(std::find(running_.begin(), running_.end(), id));
    // A static batch's member with all its tokens has finished, cancelled or not.
    r.status = r.generated >= r.max_output ? RequestStatus::Finished : RequestStatus::Cancelled;
    return true;
  }

  std::vector<RefSeq> schedule() {
    std::vector<RefSeq> plan;
    int budget = c_.budget;
    auto push = [&](ReqId id, int n) {
      Request& r = reqs_[id];
      grow(id, r.num_computed + n);
      plan.push_back({id, n, r.num_computed, r.num_computed + n == r.prompt_len + r.generated, tables_[id]});
      budget -= n;
    };
    // Decodes: running requests past their prompt.
    auto decodes = [&] {
      for (ReqId id : running_) {
        Request& r = reqs_[id];
        if (r.generated >= r.max_output || r.num_computed < r.prompt_len) continue;
        const int n = r.prompt_len + r.generated - r.num_computed;
        if (n <= budget) push(id, n);
      }
    };
    // vLLM v0's composition: admission first with the whole budget; decodes only in a step
    // that admitted nothing (the rest of this function, with no decode and no part-way prompt).
    const bool prompts_first = c_.prompts_or_decodes;
    if (!prompts_first) decodes();
    // Prompts part-way: found by scanning every running request. Each prompt chunk takes at
    // most the budget's share per allowed part-way prompt.
    const int cap = std::max(1, c_.budget / c_.max_partials);
    int partial_after = 0;
    for (ReqId id : running_) {
      Request& r = reqs_[id];
      if (r.num_computed >= r.prompt_len) continue;
      const int n = std::min({r.prompt_len - r.num_computed, budget, cap});
      if (n > 0) push(id, n);
      if (r.num_computed + n < r.prompt_len) ++partial_after;
    }
    const bool may_admit = !c_.static_batching || running_.empty();
    while (may_admit && !waiting_.empty() && int(running_.size()) < c_.max_num_seqs && budget > 0) {
      const ReqId id = waiting_.front();
      Request& r = reqs_[id];
      // The cached prefix: look each leading hash up, stop at the first miss or at the cap.
      std::vector<int> hit;
      int hit_free = 0;
      bool capped = false;
      if (c_.prefix_caching) {
        const std::vector<BlockHash>& hs = hashes_[id];
        const int most = (r.prompt_len - 1) / c_.block_size;
        for (int i = 0; i < int(hs.size()); ++i) {
          if (i == most) {
            capped = true;
            break;
          }
          auto it = index_.find(key(hs[size_t(i)]));
          if (it == index_.end()) break;
          hit.push_back(it->second);
          hit_free += ref_count(it->second) == 0;
        }
      }
      const int cached = int(hit.size()) * c_.block_size;
      const int rest = r.prompt_len - cached;
      int n = rest;
      if (c_.chunked) n = std::min({n, budget, cap});
      if (n > budget) break;
      if (n < rest && (!c_.chunked || partial_after >= c_.max_partials)) break;
      // Recompute everything for this candidate.
      int outstanding = 0;
      for (ReqId q : running_) outstanding += reserved_[q] - int(tables_[q].size());
      const int lifetime_blocks = ceil_div(long(r.prompt_len) + r.max_output, c_.block_size);
      const int need = lifetime_blocks - int(hit.size()) + hit_free;
      if (need > int(free_.size()) - outstanding) {
        counters_.refused_for_free_hits += need - hit_free <= int(free_.size()) - outstanding;
        break;
      }
      if (c_.state_slots >= 0 && int(running_.size()) >= c_.state_slots) break;
      waiting_.erase(waiting_.begin());
      reserved_[id] = lifetime_blocks;
      auto& t = tables_[id];
      for (int b : hit) {  // take the hit blocks, off the free list if nobody held them
        if (ref_[b]++ == 0) free_.erase(std::find(free_.begin(), free_.end(), b));
        t.push_back(b);
      }
      published_[id] = int(hit.size());
      counters_.hit_blocks += long(hit.size());
      counters_.hit_free_blocks += hit_free;
      counters_.hit_admissions += !hit.empty();
      counters_.capped_hits += capped && int(hit.size()) == (r.prompt_len - 1) / c_.block_size;
      running_.push_back(id);
      r.status = RequestStatus::Running;
      r.num_computed = cached;
      r.num_cached_tokens = cached;
      push(id, n);
      if (n < rest) ++partial_after;
    }
    if (prompts_first && plan.empty()) decodes();
    in_flight_ = !plan.empty();
    last_plan_ = plan;
    return plan;
  }

  std::vector<ReqId> complete() {
    in_flight_ = false;
    for (const RefSeq& s : last_plan_) {
      Request& r = reqs_[s.id];
      const bool was_in_prompt = r.num_computed < r.prompt_len;
      r.num_computed += s.num_tokens;
      if (s.samples) ++r.generated;
      if (c_.prefix_caching && was_in_prompt) publish(s.id);
    }
    auto cancelled = [&](ReqId id) {
      return std::find(pending_cancel_.begin(), pending_cancel_.end(), id) != pending_cancel_.end();
    };
    bool batch_done = true;
    for (ReqId id : running_) batch_done = batch_done && (reqs_[id].generated >= reqs_[id].max_output || cancelled(id));
    std::vector<ReqId> left, keep;
    for (ReqId id : running_) {
      Request& r = reqs_[id];
      const bool done = r.generated >= r.max_output;
      if (cancelled(id) || (done && (!c_.static_batching || batch_done))) {
        free_request(id);
        r.status = done ? RequestStatus::Finished : RequestStatus::Cancelled;
        left.push_back(id);
      } else {
        keep.push_back(id);
      }
    }
    running_ = keep;
    pending_cancel_.clear();
    return left;
  }

  int free_blocks() const { return int(free_.size()); }
  std::vector<int> free_list() const { return {free_.begin(), free_.end()}; }
  std::vector<int> table(ReqId id) const {
    auto it = tables_.find(id);
    return it == tables_.end() ? std::vector<int>{} : it->second;
  }
  int outstanding() const {
    int o = 0;
    for (ReqId q : running_) o += reserved_.at(q) - int(tables_.at(q).size());
    return o;
  }
  int referenced_blocks() const {
    int n = 0;
    for (const auto& [b, r] : ref_) n += r > 0;
    return n;
  }
  int cached_blocks() const { return int(index_.size()); }
  bool is_published(int block) const { return published_hash(block) != index_.end(); }
  const RefCounters& counters() const { return counters_; }
  const std::vector<ReqId>& running() const { return running_; }

 private:
  using Key = std::pair<uint64_t, uint64_t>;
  static Key key(const BlockHash& h) { return {h.lo, h.hi}; }
  int ref_count(int b) const {
    auto it = ref_.find(b);
    return it == ref_.end() ? 0 : it->second;
  }
  // The index entry naming `block`, found by looking at every entry.
  std::map<Key, int>::const_iterator published_hash(int block) const {
    return std::find_if(index_.begin(), index_.end(), [&](const auto& e) { return e.second == block; });
  }
  int allocate() {
    const int b = free_.front();
    free_.pop_front();
    if (auto it = published_hash(b); it != index_.end()) {
      index_.erase(it);
      ++counters_.evictions;
    }
    ref_[b] = 1;
    return b;
  }
  void grow(ReqId id, long tokens) {
    auto& t = tables_[id];
    while (int(t.size()) < ceil_div(tokens, c_.block_size)) t.push_back(allocate());
  }
  void publish(ReqId id) {
    const Request& r = reqs_[id];
    const std::vector<int>& t = tables_[id];
    const std::vector<BlockHash>& hs = hashes_[id];
    const int full = std::min({r.num_computed / c_.block_size, int(hs.size()), int(t.size())});
    for (int i = published_[id]; i < full; ++i) {
      if (index_.count(key(hs[size_t(i)]))) {
        ++counters_.duplicate_publishes;
        continue;
      }
      index_[key(hs[size_t(i)])] = t[size_t(i)];
      ++counters_.published;
    }
    published_[id] = std::max(published_[id], full);
  }
  void free_request(ReqId id) {
    const std::vector<int>& t = tables_[id];
    for (auto it = t.rbegin(); it != t.rend(); ++it) {
      if (--ref_[*it] > 0) continue;
      if (is_published(*it))
        free_.push_back(*it);
      else
        free_.push_front(*it);
    }
    tables_.erase(id);
    reserved_.erase(id);
    published_.erase(id);
    hashes_.erase(id);
  }

  RefConfig c_;
  std::vector<Request>& reqs_;
  std::list<int> free_;
  std::map<int, int> ref_;
  std::map<Key, int> index_;
  std::map<ReqId, std::vector<BlockHash>> hashes_;
  std::map<ReqId, int> published_;
  std::map<ReqId, std::vector<int>> tables_;
  std::map<ReqId, int> reserved_;
  std::vector<ReqId> waiting_, running_, pending_cancel_;
  std::vector<RefSeq> last_plan_;
  RefCounters counters_;
  bool in_flight_ = false;
};

}  // namespace tandem::testing
