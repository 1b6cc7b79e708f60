// The ideal prefix hit count of a request set: an analytic upper bound on what prefix caching
// can hit, for reports. Requests in arrival (id) order against an infinite cache in which every
// earlier request's whole prompt is available the moment the next one arrives: a request hits
// its leading full blocks whose chained hash appeared in any earlier request's prompt, at most
// (prompt_len - 1) / block_size of them (the last prompt token is always computed, as in the
// scheduler). The hashes are the run's own (hash_prompt_blocks, root_block_hash), so a run of
// the same workload hits, request by request, at most what this counts: a run's hit can only
// come from a block some earlier-admitted request published from its prompt.
//
// Queried: every request with prompt_len >= 1, including those the run fails at arrival
// (over max_model_len, larger than the KV cache) or that are cancelled before admission; a run
// counts only the requests it admitted. Compare counts (hit tokens) directly; to compare rates
// on the run's own requests, sum `hit_blocks_by_request` over the requests the run admitted.
// Every request's blocks are added to the "seen" set, failed ones too (still an upper bound).
#pragma once
#include <cstdint>
#include <vector>

#include "sim/config.h"
#include "sim/workload_gen.h"

namespace tandem {

struct PrefixBound {
  int32_t block_size = 0;
  int64_t requests = 0;      // queried: prompt_len >= 1
  int64_t requests_hit = 0;  // of those, with at least one hit block
  int64_t hit_tokens = 0, queried_tokens = 0;  // hit_tokens = hit_blocks * block_size
  int64_t hit_blocks = 0, queried_blocks = 0;  // queried_blocks: full prompt blocks, prompt_len / block_size
  std::vector<int32_t> hit_blocks_by_request;  // by ReqId (0 for an empty prompt)
  double hit_rate() const { return queried_tokens ? double(hit_tokens) / double(queried_tokens) : 0.0; }
  double block_hit_rate() const { return queried_blocks ? double(hit_blocks) / double(queried_blocks) : 0.0; }
};

// Linear in the total prompt length (every prompt is hashed once, as the run does on arrival);
// memory: 16 bytes (about 24 with the table's slack) per distinct full prompt block.
PrefixBound prefix_bound(const Workload& w, const RequestSet& set);

}  // namespace tandem
