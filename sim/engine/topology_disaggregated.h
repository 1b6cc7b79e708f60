// Prefill/decode separation (stage 4): a prefill instance computes prompts and samples the first
// token, the handoff (policies/handoff.h: phases, tickets, who frees which blocks) parks the
// request until the decode instance can take it, a KV channel moves the prompt's blocks, and the
// decode instance generates the rest. Here: the routing of events between the two instances and
// the channel, and the figures only it sees (transfers, cancels by phase).
#pragma once
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "policies/handoff.h"
#include "sim/engine/topology.h"

namespace tandem {

// Stage 4's figures that only the topology sees.
struct DisaggregationStats {
  std::string channel;
  int64_t bytes = 0;
  std::vector<double> transfer_ms;  // per delivered or failed transfer
  // Failed transfers by cause (TransferFault: error, corrupt, partial; each failed its request
  // alone) and transfers that got no answer in time (over tcp: the run ended there).
  int64_t failed_error = 0, failed_corrupt = 0, failed_partial = 0, timed_out = 0;
  // Cancels by where they found the request (parked ones: HandoffCounters::cancelled_parked).
  // Received: on D before its first step there; decode: after it.
  int64_t cancelled_prefill = 0, cancelled_transfer = 0, cancelled_received = 0, cancelled_decode = 0;
};

class DisaggregatedTopology final : public topology_i {
 public:
  // One instance of each role among `instances`; `channel` null: the sim channel (simulated
  // backend only).
  DisaggregatedTopology(const Workload& w, std::span<const std::unique_ptr<Instance>> instances,
                        std::span<Request> requests, kv_channel_i* channel, loop_i& loop);
  std::string name() const override { return "disaggregated"; }
  FailReason arrival_failure(const Request& r) const override { return handoff_->arrival_failure(r); }
  Instance& entry(ReqId) override { return prefill_; }
  bool add_request(ReqId id, Time now, std::vector<BlockHash> prompt_hashes) override {
    return handoff_->add_request(id, now, std::move(prompt_hashes));
  }
  bool cancel(ReqId id, Time now) override;
  void requests_moved(std::span<Request> requests) override;
  void before_planning(Time now) override;
  void step_planned(const Instance& in, const StepPlan& plan) override;
  bool holds_token(const Instance& in, const Request& r) const override {
    // Only the first token of a request that moves on to D (one that ends on P streams from P).
    return first_token_at_decode_ && &in == &prefill_ && r.max_output > 1;
  }
  void step_done(Instance& in, Time now) override;
  void transfer_done(const TransferDone& e, Time now) override;
  std::string transfer_lost(uint64_t ticket) override;
  void check_nothing_lost() const override;
  void add_layout(RunLayout& l) const override;
  void add_figures(Summary& s) const override;
  bool moves_kv() const override { return true; }
  RequestTransfer transfer_of(ReqId id) const override;

 private:
  // requests.cancel.at[].phase: the request is cancelled the moment it reaches that point (a
  // Cancel posted now, handled at this instant before anything else is planned).
  enum class CancelPoint : uint8_t { None, Prefill, Parked, Transfer, Received, Decode };
  void cancel_at(ReqId id, CancelPoint p);
  void count_failed_transfer(TransferFault f);

  const Workload& w_;
  std::span<Request> reqs_;
  loop_i& loop_;
  Instance& prefill_;
  Instance& decode_;
  std::unique_ptr<Handoff> handoff_;
  std::unique_ptr<kv_channel_i> own_channel_;  // the sim channel, when none was handed in
  kv_channel_i& channel_;
  // first_token_from: decode: a request's first token reaches the client when its KV reaches
  // D (the transfer's end), not when P samples it.
  const bool first_token_at_decode_;
  DisaggregationStats stats_;
  std::vector<CancelPoint> cancel_point_;  // by request; empty when no cancel is placed at a phase
  std::vector<int64_t> bytes_;             // by request
};

}  // namespace tandem
