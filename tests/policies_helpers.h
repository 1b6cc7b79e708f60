// Helpers shared by the policies-layer tests (block pool, KV cache, scheduler).
#pragma once
#include <initializer_list>
#include <span>
#include <utility>
#include <vector>

#include "policies/block_pool.h"
#include "policies/scheduler.h"

namespace tandem::testing {

// A scheduler configuration for a test, the fields it sets named: SchedulerConfig's defaults,
// except a max_model_len (1 << 20) that never binds unless max_len() says so.
struct Cfg {
  SchedulerConfig c;
  Cfg(BatchingPolicy policy, int32_t max_num_seqs, int32_t max_num_batched_tokens) {
    c.policy = policy;
    c.max_num_seqs = max_num_seqs;
    c.max_num_batched_tokens = max_num_batched_tokens;
    c.max_model_len = 1 << 20;
  }
  Cfg& max_len(int32_t v) { return c.max_model_len = v, *this; }
  Cfg& chunked(bool v) { return c.enable_chunked_prefill = v, *this; }
  Cfg& partials(int32_t v) { return c.max_num_partial_prefills = v, *this; }
  Cfg& caching(bool v) { return c.enable_prefix_caching = v, *this; }
  Cfg& composition(StepComposition v) { return c.step_composition = v, *this; }
  operator SchedulerConfig() const { return c; }
};
inline std::vector<Request> make(std::vector<std::pair<int, int>> prompt_output) {
  std::vector<Request> v;
  for (size_t i = 0; i < prompt_output.size(); ++i) {
    Request r;
    r.id = ReqId(i);
    r.prompt_len = prompt_output[i].first;
    r.max_output = prompt_output[i].second;
    v.push_back(r);
  }
  return v;
}
// Run steps until no plan; returns the number of steps.
inline int drain(Scheduler& s, Time t0 = 0) {
  int n = 0;
  for (Time t = t0; !s.schedule(t).empty(); ++t, ++n) s.complete_step(t);
  return n;
}
inline BlockHash H(uint64_t i) { return {i * 0x9e3779b97f4a7c15ULL + 1, i}; }
inline std::vector<BlockHash> hashes(std::initializer_list<uint64_t> ids) {
  std::vector<BlockHash> v;
  for (uint64_t i : ids) v.push_back(H(i));
  return v;
}
inline std::vector<int32_t> vec(std::span<const int32_t> s) { return {s.begin(), s.end()}; }
// The pool's free list, read by allocating every free block (destroys the pool's state).
inline std::vector<int32_t> drain_free_list(BlockPool& p) {
  std::vector<int32_t> order;
  while (p.num_free() > 0) order.push_back(p.allocate());
  return order;
}

}  // namespace tandem::testing
