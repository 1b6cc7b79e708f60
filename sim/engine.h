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
#include "backend/transfer/channel.h"
#include "policies/handoff.h"
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

// Stage 4's figures that only the engine sees: per transfer, and per instance.
struct DisaggregationStats {
  std::string channel;
  HandoffCounters counters;
  int64_t bytes = 0;
  std::vector<double> transfer_ms;                        // per delivered or failed transfer
  // Failed transfers by cause (TransferFault: error, corrupt, partial; each failed its request
  // alone) and transfers that got no answer in time (over tcp: the run ended there).
  int64_t failed_error = 0, failed_corrupt = 0, failed_partial = 0, timed_out = 0;
  // Cancels by where they found the request (parked ones: counters.cancelled_parked). Received:
  // on D before its first step there; decode: after it.
  int64_t cancelled_prefill = 0, cancelled_transfer = 0, cancelled_received = 0, cancelled_decode = 0;
  std::vector<double> kv_mean_util, kv_peak_util;         // per instance
  std::vector<int64_t> kv_blocks, steps;                  // per instance
};

class Engine {
 public:
  // One executor per instance of instance_specs(w) (a simulated executor may serve them all),
  // and the KV channel when the workload separates prefill and decode (null: the sim channel
  // priced from the workload).
  Engine(const Workload& w, RequestSet requests, std::span<executor_i* const> executors, clock_i& clock,
         kv_channel_i* channel = nullptr);
  Engine(const Workload& w, RequestSet requests, executor_i& executor, clock_i& clock);
  void add_observer(run_observer_i* o) { observers_.push_back(o); }
  // Real backends: also price every step with this cost model, so steps.csv shows the
  // modelled time beside the measured one (where a simulation would go wrong, step by step).
  void set_shadow_cost_model(size_t instance, std::unique_ptr<cost_model_i> m) {
    instances_.at(instance)->shadow_cost_model = std::move(m);
  }
  // Where other threads post events for the loop (thread-safe); a post wakes a waiting wall clock.
  Inbox& inbox() { return inbox_; }
  // Runs to the end. Throws std::runtime_error if a request was lost (a bug, never bad input).
  Summary run();
  const std::vector<Request>& requests() const { return requests_.requests; }
  // Output token ids per request (real backends; empty in simulated time).
  const std::vector<std::vector<Token>>& outputs() const { return outputs_; }
  // Stage 4: the handoff (null unless prefill and decode are separated) and its figures.
  const Handoff* handoff() const { return handoff_.get(); }
  const DisaggregationStats& disaggregation() const { return pd_; }
  int64_t transfer_bytes(ReqId id) const { return pd_bytes_.empty() ? 0 : pd_bytes_[size_t(id)]; }
  // Where this run serves: its instances, roles, ranks, GPUs and channel (Summary::layout).
  RunLayout layout() const;

 private:
  void on(const Arrival& e);
  void on(const StepDone& e);
  void on(const Cancel& e);
  void on(const TransferDone& e);
  void count_failed_transfer(TransferFault f);
  // requests.cancel.at[].phase: the request is cancelled the moment it reaches `p` (a Cancel
  // posted now, handled at this instant before anything else is planned).
  enum class CancelPoint : uint8_t { None, Prefill, Parked, Transfer, Received, Decode };
  void cancel_at_phase(ReqId id, CancelPoint p);
  void on(const StepFinished& e);
  void on(const PeerLost& e);
  bool awaiting_async() const { return !async_ops_.empty(); }
  void end_async(int32_t instance, uint64_t ticket);
  void check_deadlines();
  Duration async_timeout() const { return from_seconds(w_.disaggregation.channel.timeout_ms * 1e-3); }
  void finish_record(Instance& in);
  Instance& route(ReqId id) { return *instances_[handoff_ ? 0 : size_t(id) % instances_.size()]; }
  void start_transfers();
  void add_instance_figures(Summary& s) const;
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
  std::unique_ptr<Handoff> handoff_;                  // 1P1D: instance 0 prefills, 1 decodes
  std::unique_ptr<kv_channel_i> own_channel_;         // the sim channel, when none was handed in
  kv_channel_i* channel_ = nullptr;
  // 1P1D with first_token_from: decode: a request's first token reaches the client when its KV
  // reaches D (the transfer's end), not when P samples it (FirstTokenFrom).
  bool first_token_at_decode_ = false;
  DisaggregationStats pd_;
  std::vector<CancelPoint> cancel_point_;  // by request; empty when no cancel is placed at a phase
  std::vector<int64_t> pd_bytes_;  // by request (1P1D only)
  // Asynchronous work (a decode worker in another process): steps submitted and transfers
  // started whose end has not come back yet. The loop waits for them before it ends.
  // Each has a deadline: past it, the peer is taken as lost (a hang ends in seconds).
  struct AsyncOp {
    Time deadline;
    int32_t instance;  // a step of this instance, or -1: a transfer
    uint64_t ticket;
  };
  std::vector<AsyncOp> async_ops_;
  std::string run_error_;  // a lost peer: the run ends early (Summary::run_error)
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
