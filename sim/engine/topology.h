// How a run's instances are arranged, behind one interface (DESIGN.md, "After stage 4"): who
// takes an arrival and a cancel, what a finished step and a finished transfer mean, what must
// move before the next steps are planned, and what must be empty at the end. The engine's loop
// keeps the events, the clock and the inbox and never asks which arrangement it runs; events
// carry their instance (StepDone) or their ticket (TransferDone), as ns-3's events carry their
// node, so nothing is routed by position. Two implementations (make_topology, topology_factory.h):
//   colocated      N replicas (engine.data_parallel), arrivals round robin by request id
//   disaggregated  a prefill and a decode instance, the handoff (policies/handoff.h) and a KV
//                  channel between them
// Nothing here assumes one of each: a topology holds the instances it was given by role.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/transfer/channel.h"
#include "core/request.h"
#include "sim/workload/config.h"
#include "sim/engine/events.h"
#include "sim/engine/instance.h"
#include "sim/engine/metrics.h"

namespace tandem {

// What a topology may ask of the loop that drives it.
class loop_i {
 public:
  virtual ~loop_i() = default;
  virtual Time now() const = 0;  // the instant being handled
  virtual void post(Time at, Event e) = 0;
  virtual Request& request(ReqId id) = 0;
  // An asynchronous transfer started (its TransferDone comes through the inbox): the loop waits
  // for it, and past the channel's timeout takes its peer as lost.
  virtual void await_transfer(uint64_t ticket) = 0;
  virtual void request_left(const Request& r) = 0;  // it ended (finished, cancelled, failed)
  virtual void token_to_client(Request& r) = 0;     // one of its tokens reaches the client now
};

// A request's KV transfer (disaggregated runs): requests.csv's transfer columns, trace spans.
struct RequestTransfer {
  Time parked = kNever, start = kNever, end = kNever;
  int64_t bytes = 0;
};

class topology_i {
 public:
  virtual ~topology_i() = default;
  virtual std::string name() const = 0;  // "colocated" or "disaggregated"

  // An arrival: why it could never be served (FailReason::None: it can), then the instance
  // whose scheduler takes it (its prefix-caching setting decides whether the prompt is hashed),
  // then add_request (false: it failed at once, with its reason set).
  virtual FailReason arrival_failure(const Request& r) const = 0;
  virtual Instance& entry(ReqId id) = 0;
  virtual bool add_request(ReqId id, Time now, std::vector<BlockHash> prompt_hashes) = 0;
  // A cancel of a request that has arrived (alive or not); true if it ended now.
  virtual bool cancel(ReqId id, Time now) = 0;

  // An open run's request table grew and moved to `requests` (Engine, tandem serve): what the
  // topology keeps per request grows with it. The instances' schedulers and KV caches are the
  // engine's to update.
  virtual void requests_moved(std::span<Request> requests) { (void)requests; }

  // What must move at `now` before the instances plan their next steps (transfers to start).
  virtual void before_planning(Time now) { (void)now; }
  // `in` planned `plan` (not yet executed).
  virtual void step_planned(const Instance& in, const StepPlan& plan) {
    (void)in;
    (void)plan;
  }
  // Whether the token `in` sampled for `r` is held back from the client (a 1P1D client served
  // by the decode instance gets the first token when the KV arrives there).
  virtual bool holds_token(const Instance& in, const Request& r) const {
    (void)in;
    (void)r;
    return false;
  }
  // `in`'s step has ended and its tokens reached the requests: complete it on the scheduler
  // (requests that finished leave) and move on what the step finished.
  virtual void step_done(Instance& in, Time now) = 0;
  // A KV channel ended a transfer (disaggregated only).
  virtual void transfer_done(const TransferDone& e, Time now);
  // An awaited transfer got no answer in time: counts it, and says so for the run's error.
  virtual std::string transfer_lost(uint64_t ticket);

  // At the end of a run that did not fail: what must be empty beyond the schedulers (open
  // tickets, parked requests). Throws std::runtime_error naming what was lost.
  virtual void check_nothing_lost() const {}
  // What it adds to the run's layout (1P1D: the channel and where the first token comes from).
  virtual void add_layout(RunLayout& l) const { (void)l; }
  // Its figures into the summary (1P1D's transfers and cancels by phase); called after the
  // engine filled the instances' figures.
  virtual void add_figures(Summary& s) const { (void)s; }
  // Disaggregated runs: each request's transfer; false: this topology moves no KV.
  virtual bool moves_kv() const { return false; }
  virtual RequestTransfer transfer_of(ReqId id) const {
    (void)id;
    return {};
  }
};

// The sim channel's model of a workload (disaggregation.channel: bandwidth and latency, or a
// measured table; the model's KV bytes per token and block size).
ChannelModel channel_model(const Workload& w);

}  // namespace tandem
