// The discrete-event engine: replays a request table against its serving instances (today
// one; prefill/decode separation adds a second), and hands each planned step to the
// instance's executor (cost model or real backend). The loop is single-threaded; other
// threads reach it only through its inbox.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/executor.h"
#include "sim/clock.h"
#include "sim/config.h"
#include "sim/events.h"
#include "sim/inbox.h"
#include "sim/instance.h"
#include "sim/metrics.h"
#include "sim/prompt_hashes.h"
#include "sim/workload_gen.h"

namespace tandem {

// An instance that stayed idle at least this long pays for waking up (StepPlan::after_idle).
constexpr Duration kIdleGap = 1'000'000;  // 1 ms

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
  void set_shadow_cost_model(std::unique_ptr<cost_model_i> m) { instances_[0]->shadow_cost_model = std::move(m); }
  // Where other threads post events for the loop (thread-safe); a post wakes a waiting wall clock.
  Inbox& inbox() { return inbox_; }
  // Runs to the end. Throws std::runtime_error if a request was lost (a bug, never bad input).
  Summary run();
  const std::vector<Request>& requests() const { return requests_.requests; }
  // Output token ids per request (real backends; empty in simulated time).
  const std::vector<std::vector<Token>>& outputs() const { return outputs_; }

 private:
  void on(const Arrival& e);
  void on(const StepDone& e);
  void on(const Cancel& e);
  void take_in_inbox();
  void start_idle_instances();
  void start_step(Instance& in);
  void check_step_result(const Instance& in, const StepPlan& plan) const;
  void record_step(Instance& in, const StepPlan& plan);
  void post_next_arrival();
  void on_request_left(const Request& r);
  void check_nothing_lost() const;
  void attach_tokens(StepPlan& plan);

  const Workload& w_;
  RequestSet requests_;
  clock_i& clock_;
  std::vector<std::unique_ptr<Instance>> instances_;  // by id; pointers, so an instance never moves
  EventQueue events_;
  Inbox inbox_;
  MetricsRecorder metrics_;
  std::vector<run_observer_i*> observers_;
  std::vector<std::vector<Token>> outputs_;
  PromptTokens prompt_tokens_;
  BlockHash hash_root_;
  size_t next_arrival_ = 0;
  Time now_ = 0;
  int64_t num_steps_ = 0;  // over all instances: a step's index in steps.csv
};

}  // namespace tandem
