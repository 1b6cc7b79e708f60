// The ideal prefix hit count of a request set: an analytic upper bound on what prefix caching
// can hit, for reports. Requests in arrival (id) order against an infinite cache in which every
// earlier request's whole prompt is available the moment the next one arrives: a request hits
// its leading full blocks whose chained hash appeared in any earlier request's prompt, at most
// (prompt_len - 1) / block_size of them (the last prompt token is always computed, as in the
// scheduler). The hashes are the run's own (hash_prompt_blocks, root_block_hash), so a run of
// the same workload hits, request by request, at most what this counts: a run's hit can only
// come from a block some earlier-admitted request published from its prompt.
//
// Two denominators: every request with prompt_len >= 1 (`requests`, `queried_*`), and the
// requests the run can serve, those that pass the scheduler's arrival checks (`servable_*`:
// not over max_model_len, not larger than the KV cache, ...). A run's rate divides by the
// requests it admitted, which are servable ones (fewer, if some are cancelled before
// admission): compare it with servable_hit_rate(). A request that fails at arrival is never
// hashed (no per-token work for a request that cannot run; its blocks never enter a cache) and
// hits nothing. Hit counts (tokens) compare directly with a run's.
#pragma once
#include <cstdint>
#include <vector>

#include "sim/workload/config.h"
#include "sim/workload/workload_gen.h"

namespace tandem {

struct PrefixBound {
  int32_t block_size = 0;
  int64_t requests = 0;                        // queried: prompt_len >= 1
  int64_t requests_hit = 0;                    // of those, with at least one hit block
  int64_t hit_tokens = 0, queried_tokens = 0;  // hit_tokens = hit_blocks * block_size
  int64_t hit_blocks = 0, queried_blocks = 0;  // queried_blocks: full prompt blocks, prompt_len / block_size
  int64_t servable_requests = 0, servable_queried_tokens = 0;  // requests that pass the arrival checks
  std::vector<int32_t> hit_blocks_by_request;  // by ReqId (0 for an empty prompt or a request that fails at arrival)
  double hit_rate() const { return queried_tokens ? double(hit_tokens) / double(queried_tokens) : 0.0; }
  double block_hit_rate() const { return queried_blocks ? double(hit_blocks) / double(queried_blocks) : 0.0; }
  double servable_hit_rate() const {
    return servable_queried_tokens ? double(hit_tokens) / double(servable_queried_tokens) : 0.0;
  }
};

// Linear in the total prompt length (every prompt is hashed once, as the run does on arrival);
// memory: 16 bytes (about 24 with the table's slack) per distinct full prompt block.
PrefixBound prefix_bound(const Workload& w, const RequestSet& set);

}  // namespace tandem
