// The step: what the scheduler hands to an executor, and what comes back.
// Requests are referred to by id so a plan can be logged, replayed and diffed.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "sim/request.h"
#include "sim/time.h"

namespace tandem {

struct ScheduledSeq {
  ReqId id = 0;
  int32_t num_tokens = 0;           // tokens computed this step, starting at num_computed_before
  int32_t num_computed_before = 0;  // tokens already in the KV cache (the context)
  bool samples = false;           // this step reaches the end of the sequence: sample a token
  std::span<const int32_t> block_table;  // KV block ids; valid until the scheduler next mutates
};

constexpr Duration kIdleGap = 1'000'000;  // 1 ms

struct StepPlan {
  std::vector<ScheduledSeq> seqs;
  int32_t num_tokens = 0;       // == sum of seqs[i].num_tokens
  int32_t num_prefill_seqs = 0; // seqs still in their prompt (num_computed_before < prompt_len)
  int32_t num_decode_seqs = 0;
  int32_t num_samples = 0;
  // Input token ids, seqs in order, num_tokens each. Attached by the engine for executors that
  // compute (real backends); empty in simulated time. The scheduler never reads them.
  std::vector<Token> tokens;
  // The instance was idle (at least kIdleGap) before this step. Set by the engine; a real
  // backend pays for waking up (threads, caches, clocks) and a fitted cost model charges it.
  bool after_idle = false;
  void clear() {
    seqs.clear();
    tokens.clear();
    after_idle = false;
    num_tokens = num_prefill_seqs = num_decode_seqs = num_samples = 0;
  }
  bool empty() const { return seqs.empty(); }
};

// Where a step's time went (cost models fill it; real backends may leave it zero). Seconds.
struct StepCost {
  double gemm_s = 0;       // linear layers and LM head
  double attention_s = 0;  // attention over the KV cache
  double overhead_s = 0;   // fixed per-step cost
  double comm_s = 0;       // tensor-parallel all-reduces
  double total_s() const { return gemm_s + attention_s + overhead_s + comm_s; }
};

struct StepResult {
  Duration elapsed = 0;
  StepCost cost;
  std::vector<Token> sampled;  // one per seq with samples, in plan order; empty in simulated time
};

}  // namespace tandem
