// Warm-up before serving: first-use costs (waking threads, page faults of scratch buffers,
// cuBLAS handles, a CUDA Graph capture per decode bucket) are paid here, not by the first
// requests, whose TTFT they would otherwise inflate (a 361 ms first step on the H200, for a
// 40 ms shape). The steps write K/V into blocks from 0 up; a sequence writes every position
// before it reads it, so what is served afterwards does not change.
#pragma once
#include <cstdint>

#include "backend/executor.h"

namespace tandem {

struct WarmUpShape {
  int32_t num_blocks = 0, block_size = 16;
  int32_t max_step_tokens = 0, max_seqs = 0;  // the engine's limits
  int32_t max_model_len = 0;
};

// A prefill step, then a decode step at each power of two of sequences up to max_seqs (and
// max_seqs itself), so that every CUDA Graph bucket a run can use is captured. Returns the
// number of steps run.
int warm_up(executor_i& exec, const WarmUpShape& s);

}  // namespace tandem
