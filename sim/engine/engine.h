// The discrete-event engine: replays a request table against its serving instances and hands
// each planned step to the instance's executor (cost model or real backend). The engine is the
// loop (events, clock, inbox, deadlines, steps, metrics); how the instances are arranged
// (replicas, or prefill + decode with a KV channel) is its topology (sim/engine/topology.h), which it
// never asks about by name. The loop is single-threaded; other threads reach it only through its
// inbox.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/executor.h"
#include "backend/transfer/channel.h"
#include "sim/engine/clock.h"
#include "sim/engine/events.h"
#include "sim/engine/inbox.h"
#include "sim/engine/instance.h"
#include "sim/engine/metrics.h"
#include "sim/engine/topology.h"
#include "sim/workload/config.h"
#include "sim/workload/prompt_hashes.h"
#include "sim/workload/workload_gen.h"

namespace tandem {

// An instance that stayed idle at least this long pays for waking up (StepPlan::after_idle).
constexpr Duration kIdleGap = 1'000'000;  // 1 ms

class run_observer_i {
 public:
  virtual ~run_observer_i() = default;
  virtual void on_step(const StepRecord&) {}
  virtual void on_request_done(const Request&) {}
  // One of r's tokens reaches its client at `at` (on a real backend, the k-th call for r is
  // Engine::outputs()[r.id][k], already there).
  virtual void on_token(const Request& r, Time at) {
    (void)r;
    (void)at;
  }
  // The loop has handled one event (all of a step's tokens, say): what an observer gathered
  // during it can leave together (tandem serve hands a step's tokens to its front end at once).
  virtual void on_event_done() {}
};

// Prompts given as token ids by clients (`tandem serve`), instead of generated from the seed.
// prompt(id) is read on the loop's thread only, after the request's Submit was taken in.
class client_prompts_i {
 public:
  virtual ~client_prompts_i() = default;
  virtual std::span<const Token> prompt(ReqId id) const = 0;
};

class Engine final : private loop_i {
 public:
  // The instances `specs` (instance_specs(w), computed once by the run's set-up, sim/run/run_setup.h),
  // one executor per instance, and the KV channel when the workload separates prefill and decode
  // (null: the sim channel priced from the workload).
  Engine(const Workload& w, std::vector<InstanceSpec> specs, RequestSet requests,
         std::span<executor_i* const> executors, clock_i& clock, kv_channel_i* channel = nullptr);
  // Tests: one executor serves every instance of instance_specs(w) (a simulated one may).
  Engine(const Workload& w, RequestSet requests, executor_i& executor, clock_i& clock);
  Engine(const Engine&) = delete;  // its topology holds it as its loop
  Engine& operator=(const Engine&) = delete;
  void add_observer(run_observer_i* o) { observers_.push_back(o); }
  // Real backends: also price every step with this cost model, so steps.csv shows the
  // modelled time beside the measured one (where a simulation would go wrong, step by step).
  void set_shadow_cost_model(size_t instance, std::unique_ptr<cost_model_i> m) {
    instances_.at(instance)->shadow_cost_model = std::move(m);
  }
  // Where other threads post events for the loop (thread-safe); a post wakes a waiting wall clock.
  Inbox& inbox() { return inbox_; }
  // An open run (`tandem serve`): the request table's slots are empty (arrival kNever) and
  // requests come as Submit events through the inbox; the run ends after a Close, once every
  // request that came in has left, and its outputs hold the slots used (ids 0 .. n-1, in the
  // order the front end handed them out). `prompts`: their token ids (null: from the seed).
  // The table may start empty: a Submit past its end grows it (and every per-request table of
  // the schedulers, KV caches and topology) by doubling, so memory follows the requests taken.
  void open_arrivals(const client_prompts_i* prompts) {
    open_ = true;
    client_prompts_ = prompts;
  }
  // Runs to the end. Throws std::runtime_error if a request was lost (a bug, never bad input).
  Summary run();
  const std::vector<Request>& requests() const { return requests_.requests; }
  // Output token ids per request (real backends; empty in simulated time).
  const std::vector<std::vector<Token>>& outputs() const { return outputs_; }
  // How the instances are arranged (a disaggregated one moves KV: transfer_of per request).
  const topology_i& topology() const { return *topology_; }
  // Where this run serves: its instances, roles, ranks, GPUs and channel (Summary::layout).
  RunLayout layout() const;

 private:
  Engine(const Workload& w, const std::vector<InstanceSpec>& specs, RequestSet requests, executor_i& executor,
         clock_i& clock);
  void on(const Arrival& e);
  void on(const StepDone& e);
  void on(const Cancel& e);
  void on(const TransferDone& e);
  void on(const StepFinished& e);
  void on(const PeerLost& e);
  void on(const Submit& e);
  void on(const Close& e);
  void token_reached_client(Request& r, Time at);
  bool awaiting_async() const { return !async_ops_.empty(); }
  void end_async(int32_t instance, uint64_t ticket);
  void check_deadlines();
  Duration async_timeout() const { return from_seconds(w_.disaggregation.channel.timeout_ms * 1e-3); }
  void finish_record(Instance& in);
  void add_instance_figures(Summary& s) const;
  void take_in_inbox();
  void start_idle_instances();
  void start_step(Instance& in);
  void check_step_result(const Instance& in, const StepPlan& plan) const;
  void record_step(Instance& in, const StepPlan& plan);
  void post_next_arrival();
  void on_request_left(const Request& r);
  void grow_open_table(size_t min_size);
  void check_nothing_lost() const;
  void attach_tokens(StepPlan& plan);

  // loop_i: what the topology may ask of the loop.
  Time now() const override { return now_; }
  void post(Time at, Event e) override { events_.post(at, std::move(e)); }
  Request& request(ReqId id) override { return requests_.requests[size_t(id)]; }
  void await_transfer(uint64_t ticket) override;
  void request_left(const Request& r) override { on_request_left(r); }
  void token_to_client(Request& r) override { token_reached_client(r, now_); }

  const Workload& w_;
  const std::vector<InstanceSpec> specs_;  // by instance id
  RequestSet requests_;
  clock_i& clock_;
  std::vector<std::unique_ptr<Instance>> instances_;  // by id; pointers, so an instance never moves
  std::unique_ptr<topology_i> topology_;
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
  std::vector<std::vector<Token>> outputs_;  // by request, real backends only (records_outputs_)
  bool records_outputs_ = false;
  PromptTokens prompt_tokens_;
  BlockHash hash_root_;
  size_t next_arrival_ = 0;
  bool open_ = false;      // arrivals come as Submit events (tandem serve)
  bool closed_ = false;    // ... until a Close
  size_t num_opened_ = 0;  // an open run's slots used so far (the highest Submit id + 1)
  const client_prompts_i* client_prompts_ = nullptr;
  // A trace that gives the prompts' token ids (RequestSet::given_prompt) serves them as a
  // client's: the same hashing and the same ids into the plans as `tandem serve`.
  struct GivenPrompts final : client_prompts_i {
    const RequestSet& set;
    explicit GivenPrompts(const RequestSet& s) : set(s) {}
    std::span<const Token> prompt(ReqId id) const override { return set.given_prompt(set.requests[size_t(id)]); }
  } given_prompts_{requests_};
  Time now_ = 0;
  int64_t num_steps_ = 0;  // over all instances: a step's index in steps.csv
};

}  // namespace tandem
