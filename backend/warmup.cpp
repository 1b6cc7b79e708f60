#include "backend/warmup.h"

#include <algorithm>
#include <vector>

#include "policies/kv_cache.h"

namespace tandem {

int warm_up(executor_i& exec, const WarmUpShape& s) {
  // An asynchronous executor (a decode worker) warms up in its own process.
  if (exec.simulated() || exec.asynchronous() || s.num_blocks <= 0) return 0;
  const int32_t bs = s.block_size;
  std::vector<std::vector<int32_t>> tables;
  StepPlan plan;
  int steps = 0;
  const auto run = [&] {
    plan.tokens.assign(size_t(plan.num_tokens), Token(1));
    exec.execute(plan);
    ++steps;
  };
  // One prefill chunk: at most 256 tokens (the CPU pays for every token; the GPU's buffers
  // are sized at start-up anyway).
  const int32_t n = std::min({s.max_step_tokens, s.max_model_len, s.num_blocks * bs, 256});
  if (n >= 1) {
    tables.assign(1, {});
    for (int32_t b = 0; b < blocks_for(n, bs); ++b) tables[0].push_back(b);
    plan.clear();
    plan.add({0, n, 0, true, tables[0]}, n);
    run();
  }
  const int32_t max_seqs = std::min(s.max_seqs, s.num_blocks);
  std::vector<int32_t> sizes;
  for (int32_t k = 1; k < max_seqs; k *= 2) sizes.push_back(k);
  if (max_seqs >= 1) sizes.push_back(max_seqs);
  tables.assign(size_t(std::max(0, max_seqs)), {});
  for (int32_t i = 0; i < max_seqs; ++i) tables[size_t(i)] = {i};
  for (int32_t k : sizes) {  // one token each at position 0, every one sampled: a decode-only step
    plan.clear();
    for (int32_t i = 0; i < k; ++i) plan.add({ReqId(i), 1, 0, true, tables[size_t(i)]}, 0);  // prompt done: a decode
    run();
  }
  return steps;
}

}  // namespace tandem
