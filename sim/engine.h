// The discrete-event engine: replays a request table against the scheduler, and hands each
// planned step to an executor (cost model or real backend). Single-threaded.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/executor.h"
#include "policies/kv_cache.h"
#include "policies/scheduler.h"
#include "sim/clock.h"
#include "sim/config.h"
#include "sim/events.h"
#include "sim/metrics.h"
#include "sim/prompt_hashes.h"
#include "sim/workload_gen.h"

namespace tandem {

// What a step looked like, for steps.csv, the Chrome trace and progress reports.
struct StepRecord {
  int64_t index = 0;
  int32_t instance = 0;
  Time start = 0;
  Duration elapsed = 0;
  const StepPlan* plan = nullptr;
  StepCost cost;  // zero for real backends
  int32_t kv_used = 0, kv_reserved = 0, kv_capacity = 0, waiting = 0, running = 0;  // after planning
};

class run_observer_i {
 public:
  virtual ~run_observer_i() = default;
  virtual void on_step(const StepRecord&) {}
  virtual void on_request_done(const Request&) {}
};

class Engine {
 public:
  Engine(const Workload& w, RequestSet requests, executor_i& executor, clock_i& clock);
  void add_observer(run_observer_i* o) { observers_.push_back(o); }
  // Real backends: also price every step with this cost model, so steps.csv shows the
  // modelled time beside the measured one (where a simulation would go wrong, step by step).
  void set_shadow_cost_model(std::unique_ptr<cost_model_i> m) { shadow_ = std::move(m); }
  // Runs to the end. Throws std::runtime_error if a request was lost (a bug, never bad input).
  Summary run();
  const std::vector<Request>& requests() const { return set_.requests; }
  const RequestSet& request_set() const { return set_; }
  // Output token ids per request (real backends; empty in simulated time).
  const std::vector<std::vector<Token>>& outputs() const { return outputs_; }

 private:
  void on(const Arrival& e);
  void on(const StepDone& e);
  void on(const TransferDone& e);
  void on(const Cancel& e);
  void start_step_if_idle();
  void post_next_arrival();
  void done(const Request& r);
  void attach_tokens(StepPlan& plan);
  void drop_prompt_hashes(ReqId id);

  const Workload& w_;
  RequestSet set_;
  executor_i& exec_;
  clock_i& clock_;
  KvCache kv_;
  Scheduler sched_;
  EventQueue events_;
  MetricsRecorder metrics_;
  std::vector<run_observer_i*> observers_;
  std::unique_ptr<cost_model_i> shadow_;
  std::vector<std::vector<Token>> outputs_;
  PromptTokens prompt_;
  // Prefix caching: each live request's prompt block hashes, from arrival until its prompt is
  // computed (or it leaves); the scheduler holds views of them.
  std::vector<std::vector<BlockHash>> prompt_hashes_;
  BlockHash hash_root_;
  size_t next_arrival_ = 0;
  Time now_ = 0;
  StepRecord inflight_;
  StepResult inflight_result_;
  int64_t steps_ = 0;
  Time last_step_end_ = 0;
};

}  // namespace tandem
