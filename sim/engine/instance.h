// One serving instance: a scheduler over its own KV cache, the executor that runs its steps,
// and the step it has in flight. Colocated serving is one instance; prefill/decode separation
// is two, with events that name theirs (StepDone::instance), as ns-3's events carry a context.
// An instance is never moved or copied (its scheduler keeps a reference to its KV cache): the
// engine holds each by pointer.
#pragma once
#include <cstdint>
#include <memory>

#include "backend/executor.h"
#include "policies/kv_cache.h"
#include "policies/scheduler.h"

namespace tandem {

// What a step looked like, for steps.csv, the Chrome trace and progress reports.
struct StepRecord {
  int64_t index = 0;
  int32_t instance = 0;
  Time start = 0;
  Duration elapsed = 0;
  const StepPlan* plan = nullptr;
  StepCost cost;                                                                    // zero for real backends
  int32_t kv_used = 0, kv_reserved = 0, kv_capacity = 0, waiting = 0, running = 0;  // after planning
  // When the step's sampled tokens reached their requests: the time MetricsRecorder::on_token
  // takes (set as the step is done; after start + elapsed when a remote worker answered late).
  Time tokens_at = 0;
  // A real backend's step run here (not on a remote worker or in simulated time): the loop's own
  // time on it outside the executor, from before planning to its tokens reaching their requests
  // (planning, the tokens' copy in, checks, delivery). -1 where not measured.
  Duration host = -1;
};

struct KvCacheShape {
  int32_t num_blocks = 0, block_size = kDefaultBlockSize, num_state_slots = -1;
};

struct Instance {
  Instance(int32_t id_, const SchedulerConfig& cfg, const KvCacheShape& kv_shape, std::span<Request> requests,
           executor_i& exec)
      : id(id_),
        role(cfg.role),
        kv(kv_shape.num_blocks, kv_shape.block_size, kv_shape.num_state_slots, int32_t(requests.size())),
        scheduler(cfg, requests, kv),
        executor(exec) {
    inflight.instance = id_;
  }
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  const int32_t id;
  const InstanceRole role;
  KvCache kv;
  Scheduler scheduler;  // holds a reference to kv
  executor_i& executor;
  // Real backends: every step also priced by this cost model, so that steps.csv shows the
  // modelled time beside the measured one.
  std::unique_ptr<cost_model_i> shadow_cost_model;
  StepRecord inflight;         // the step in flight (valid while scheduler.in_flight())
  StepResult inflight_result;  // its result, handed back at its StepDone
  int64_t num_steps = 0;       // steps this instance has run
  Time last_step_end = 0;
  Time step_began = -1;        // the clock when the step in flight began planning (host time measured; else -1)
  // KV use over its busy time (summary.json's per-instance figures).
  double kv_used_time = 0, busy_time = 0, kv_peak = 0;
  double model_flops = 0;  // the sum of its steps' step_flops (backend/cost_model.h)
};

}  // namespace tandem
