// Prefill/decode separation (stage 4), the bookkeeping between the two instances' schedulers:
// which side holds a request, the transfer tickets, and who may free which blocks when.
//
//   arrival -> Prefill (P's scheduler: waiting, running, chunked, prefix hits)
//           -> Parked   first token sampled on P; P's blocks held; waits FCFS for a seat on D
//           -> Transfer D reserved the whole life and took the prompt's blocks; a ticket is
//                       open; the channel reads P's blocks and writes D's
//           -> Decode   D's scheduler (running, finished)
//
// Ownership (the rule vLLM's connector API and SGLang's preallocation teach): while a ticket is
// open, neither side frees the request's blocks; only the channel's completion (done or
// aborted) does, through complete(). A cancel during a transfer only marks the request, unless
// the channel says it stopped writing at once. Tickets are never reused, so a completion that
// arrives after its request ended (a stale one) is recognised and ignored.
//
// Nothing here knows the channel or the clock: the engine hands the orders to its channel and
// the completions back here, so the lifecycle tests drive it step by step.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/request.h"
#include "policies/scheduler.h"

namespace tandem {

enum class PdPhase : uint8_t { None, Prefill, Parked, Transfer, Decode, Gone };

// One transfer to start: P's blocks to D's, the prompt's KV (num_tokens positions).
struct TransferOrder {
  uint64_t ticket = 0;
  ReqId id = 0;
  int32_t num_tokens = 0;
  std::span<const int32_t> src_blocks;  // on P; valid until P's scheduler next mutates
  std::span<const int32_t> dst_blocks;  // on D; likewise
};

// Per request, the instants of its handoff (kNever where not reached).
struct HandoffTimes {
  Time parked = kNever;          // first token sampled on P: the prompt is done
  Time transfer_start = kNever;  // D accepted it; the channel started
  Time transfer_end = kNever;    // the channel's completion (done or aborted)
};

struct HandoffCounters {
  int64_t started = 0, delivered = 0, failed = 0, aborted = 0, stale = 0;
  int64_t cancelled_parked = 0;  // cancelled while waiting for a seat on D (no transfer)
};

class Handoff {
 public:
  Handoff(Scheduler& prefill, Scheduler& decode, std::span<Request> requests);

  // Why a request arriving now could never be served in 1P1D: P's reasons, then D's (a request
  // that fits P but never D fails here, rather than wait parked forever).
  FailReason arrival_failure(const Request& r) const;
  // A request arrives: to P's queue. False if it failed at once (reason set).
  bool add_request(ReqId id, Time now, std::vector<BlockHash> prompt_hashes);
  // After P's complete_step: its prefilled() requests wait for a seat on D, in that order.
  void park(std::span<const ReqId> ids, Time now);
  // Starts transfers while D can take the head of the parked queue (FCFS: the head blocks the
  // rest). Returns the orders to hand to the channel, valid until the next call.
  std::span<const TransferOrder> start_transfers(Time now);

  enum class Outcome : uint8_t { Stale, Delivered, Cancelled, Failed };
  // The channel ended `ticket`: ok (every block written) or not (failed, timed out, aborted).
  // P's blocks go in every case. Delivered: the request decodes on D. Cancelled: it had been
  // cancelled during the transfer; D's blocks go too. Failed: D's blocks go and the request
  // fails (TransferFailed). Stale: the ticket is not open (already ended): nothing happens.
  // `id`, if given, receives the ticket's request (not for a stale one).
  Outcome complete(uint64_t ticket, bool ok, Time now, ReqId* id = nullptr);
  // Cancels a request in a handoff phase: it ends (cancelled) now, as the client sees it. Its
  // blocks: Parked, P's go now. Transfer: if `channel_stopped` (the channel's abort was
  // synchronous: it will never write again), both sides go now and the ticket closes;
  // otherwise both stay held until complete() (a deferred abort). Returns whether the blocks
  // went now.
  bool cancel(ReqId id, Time now, bool channel_stopped);
  // A cancel wherever the request is: on P or D through that scheduler (a request inside a step
  // there leaves when the step ends), parked or in transfer through cancel() above, asking the
  // channel to stop only in Transfer (`stop_channel(ticket)`: true if it will never write
  // again). `left`: the request ended now (its client sees it). The engine and the property test
  // both cancel through here, so the routing by phase is tested where it runs.
  struct CancelOutcome {
    PdPhase phase = PdPhase::None;  // where the cancel found it
    bool left = false;
  };
  CancelOutcome cancel_anywhere(ReqId id, Time now, const std::function<bool(uint64_t)>& stop_channel);

  // An open run's request table grew (Scheduler::requests_moved): its per-request tables grow
  // with it. The schedulers are their instances' to update.
  void requests_moved(std::span<Request> requests);

  PdPhase phase(ReqId id) const { return phase_[static_cast<size_t>(id)]; }
  uint64_t ticket_of(ReqId id) const;  // 0 if none open
  const HandoffTimes& times(ReqId id) const { return times_[static_cast<size_t>(id)]; }
  int32_t num_parked() const { return static_cast<int32_t>(parked_.size()); }
  int32_t open_tickets() const { return static_cast<int32_t>(open_.size()); }
  const HandoffCounters& counters() const { return counters_; }

 private:
  struct Open {
    ReqId id;
    bool cancelled;
  };
  void end_transfer(ReqId id, Time now);

  Scheduler& p_;
  Scheduler& d_;
  std::span<Request> reqs_;
  std::vector<PdPhase> phase_;
  std::vector<HandoffTimes> times_;
  std::deque<ReqId> parked_;  // FCFS; may hold cancelled ids, skipped lazily
  std::unordered_map<uint64_t, Open> open_;
  std::vector<uint64_t> ticket_;  // by request: its open ticket, 0 if none
  uint64_t next_ticket_ = 1;
  std::vector<TransferOrder> orders_;
  HandoffCounters counters_;
};

}  // namespace tandem
