// The step: what the scheduler hands to an executor, and what comes back.
// Requests are referred to by id so a plan can be logged, replayed and diffed.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/request.h"
#include "core/time.h"

namespace tandem {

struct ScheduledSeq {
  ReqId id = 0;
  int32_t num_tokens = 0;                // tokens computed this step, starting at num_computed_before
  int32_t num_computed_before = 0;       // tokens already in the KV cache (the context)
  bool samples = false;                  // this step reaches the end of the sequence: sample a token
  std::span<const int32_t> block_table;  // KV block ids; valid until the scheduler next mutates
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;
  int32_t num_tokens = 0;        // == sum of seqs[i].num_tokens
  int32_t num_prefill_seqs = 0;  // seqs still in their prompt (num_computed_before < prompt_len)
  int32_t num_decode_seqs = 0;
  int32_t num_samples = 0;
  // Input token ids, seqs in order, num_tokens each. Attached by the engine for executors that
  // compute (real backends); empty in simulated time. The scheduler never reads them.
  std::vector<Token> tokens;
  // The instance was idle before this step (the engine's rule, kIdleGap). Set by the engine; a
  // real backend pays for waking up (threads, caches, clocks) and a fitted cost model charges it.
  bool after_idle = false;
  // The one way to put a sequence in a plan: appends it and keeps the counters in step. A
  // sequence is a prefill while it is still in its prompt (num_computed_before < prompt_len),
  // so a one-token last prompt chunk counts as a prefill, as the scheduler sees it.
  void add(const ScheduledSeq& s, int32_t prompt_len) {
    seqs.push_back(s);
    num_tokens += s.num_tokens;
    num_samples += s.samples;
    ++(s.num_computed_before < prompt_len ? num_prefill_seqs : num_decode_seqs);
  }
  void clear() {
    seqs.clear();
    tokens.clear();
    after_idle = false;
    num_tokens = num_prefill_seqs = num_decode_seqs = num_samples = 0;
  }
  bool empty() const { return seqs.empty(); }
};

// The prompt length of a seq known only by its context and its new tokens (reference steps,
// benchmarks and tests build such plans): one new token after a context is a decode (its prompt
// was the context), anything else a prompt, or a prompt's chunk that ends it. For StepPlan::add.
inline int32_t implied_prompt_len(int32_t num_computed_before, int32_t num_tokens) {
  return num_tokens == 1 && num_computed_before > 0 ? num_computed_before : num_computed_before + num_tokens;
}

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
