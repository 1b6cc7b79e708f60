// Stage 4 lifecycle tests, in the style of vLLM's test_remote_decode_lifecycle.py: a prefill
// and a decode scheduler with tiny pools and the handoff between them, driven step by step with
// the channel played by hand (tickets completed when the test says). After each step the pools'
// counters are asserted; every test ends with "both pools empty, no open ticket".
#include <doctest/doctest.h>

#include "policies/handoff.h"
#include "tests/policies_helpers.h"

using namespace tandem;
using namespace tandem::testing;

namespace {

constexpr int32_t kBlock = 4;

// Two instances and the handoff. P: prompt only; D: the whole life, prefix caching off.
struct Pd {
  std::vector<Request> reqs;
  KvCache kp, kd;
  Scheduler p, d;
  Handoff h;
  Pd(std::vector<Request> r, int32_t p_blocks, int32_t d_blocks, int32_t budget = 64, int32_t seqs = 8)
      : reqs(std::move(r)),
        kp(p_blocks, kBlock, -1, int32_t(reqs.size())),
        kd(d_blocks, kBlock, -1, int32_t(reqs.size())),
        p(role(Cfg(BatchingPolicy::Continuous, seqs, budget).caching(false), InstanceRole::Prefill), reqs, kp),
        d(role(Cfg(BatchingPolicy::Continuous, seqs, budget).caching(false), InstanceRole::Decode), reqs, kd),
        h(p, d, reqs) {}
  static SchedulerConfig role(SchedulerConfig c, InstanceRole r) {
    c.role = r;
    return c;
  }
  void arrive(ReqId id, Time t = 0) { h.add_request(id, t, {}); }
  // One P step: plan, complete, park what it prefilled. Returns the plan's size.
  size_t step_p(Time t) {
    const size_t n = p.schedule(t).seqs.size();
    if (n == 0) return 0;
    p.complete_step(t);
    h.park(p.prefilled(), t);
    return n;
  }
  size_t step_d(Time t) {
    const size_t n = d.schedule(t).seqs.size();
    if (n) d.complete_step(t);
    return n;
  }
  std::vector<TransferOrder> start(Time t) {
    const auto o = h.start_transfers(t);
    return {o.begin(), o.end()};
  }
  bool empty() const {
    return kp.used_blocks() == 0 && kd.used_blocks() == 0 && kp.reserved_remaining() == 0 &&
           kd.reserved_remaining() == 0 && h.open_tickets() == 0 && h.num_parked() == 0;
  }
};

}  // namespace

TEST_CASE("1P1D lifecycle: basic: prefill, park, transfer, decode, finish; both pools empty") {
  Pd s(make({{10, 4}}), 16, 16);
  s.arrive(0);
  CHECK(s.step_p(0) == 1);
  CHECK(s.reqs[0].generated == 1);          // the first token is sampled on P
  CHECK(s.p.num_running() == 0);            // its seat on P is free...
  CHECK(s.kp.used_blocks() == 3);           // ...its prompt's 3 blocks are held for the channel
  CHECK(s.h.phase(0) == PdPhase::Parked);
  const auto orders = s.start(1);
  REQUIRE(orders.size() == 1);
  CHECK(orders[0].src_blocks.size() == 3);
  CHECK(orders[0].dst_blocks.size() == 3);  // D took the prompt's blocks before the transfer...
  CHECK(s.kd.used_blocks() == 3);
  CHECK(s.kd.reserved_remaining() == 1);    // ...and reserved the whole life: blocks(10 + 4) = 4
  CHECK(s.h.open_tickets() == 1);
  CHECK(s.step_d(2) == 0);                  // nothing to decode while receiving
  CHECK(s.h.complete(orders[0].ticket, true, 3) == Handoff::Outcome::Delivered);
  CHECK(s.kp.used_blocks() == 0);           // P lets go only at the completion
  CHECK(s.h.phase(0) == PdPhase::Decode);
  for (Time t = 4; s.step_d(t) > 0; ++t) {
  }
  CHECK(s.reqs[0].status == RequestStatus::Finished);
  CHECK(s.reqs[0].generated == 4);
  CHECK(s.empty());
}

TEST_CASE("1P1D lifecycle: D full: the next request waits parked with P's blocks pinned, FCFS") {
  // D holds 4 blocks: one request's life (10 + 4 tokens = 4 blocks) at a time.
  Pd s(make({{10, 4}, {9, 5}}), 16, 4);
  s.arrive(0);
  s.arrive(1);
  CHECK(s.step_p(0) == 2);
  CHECK(s.kp.used_blocks() == 6);
  auto o = s.start(1);
  REQUIRE(o.size() == 1);
  CHECK(o[0].id == 0);
  CHECK(s.h.num_parked() == 1);             // request 1 waits, its 3 blocks pinned on P
  CHECK(s.start(2).empty());                // still no room
  s.h.complete(o[0].ticket, true, 3);
  CHECK(s.kp.used_blocks() == 3);
  Time t = 4;
  for (; s.reqs[0].alive(); ++t) {
    CHECK(s.start(t).empty());  // D stays full while request 0 decodes
    s.step_d(t);
  }
  CHECK(s.reqs[0].status == RequestStatus::Finished);
  o = s.start(t);
  REQUIRE(o.size() == 1);
  CHECK(o[0].id == 1);
  s.h.complete(o[0].ticket, true, 11);
  for (Time t = 12; s.step_d(t) > 0; ++t) {
  }
  CHECK(s.reqs[1].status == RequestStatus::Finished);
  CHECK(s.empty());
}

TEST_CASE("1P1D lifecycle: cancel while running on P (inside its step): freed when the step ends, never parked") {
  Pd s(make({{10, 4}}), 16, 16);
  s.arrive(0);
  REQUIRE(!s.p.schedule(0).empty());
  CHECK_FALSE(s.p.cancel(0, 0));  // in flight: leaves at the step's end
  s.p.complete_step(1);
  CHECK(s.p.prefilled().empty());
  s.h.park(s.p.prefilled(), 1);
  CHECK(s.reqs[0].status == RequestStatus::Cancelled);
  CHECK(s.start(2).empty());
  CHECK(s.empty());
}

TEST_CASE("1P1D lifecycle: cancel while sending with D full: P's blocks go at once, D untouched") {
  Pd s(make({{10, 4}, {9, 5}}), 16, 4);
  s.arrive(0);
  s.arrive(1);
  s.step_p(0);
  const auto o = s.start(1);
  REQUIRE(o.size() == 1);
  CHECK(s.h.phase(1) == PdPhase::Parked);
  CHECK(s.h.cancel(1, 2, true));  // no transfer started: nothing can write
  CHECK(s.reqs[1].status == RequestStatus::Cancelled);
  CHECK(s.kp.used_blocks() == 3);  // only request 0's blocks, still sending
  CHECK(s.kd.used_blocks() == 3);
  s.h.complete(o[0].ticket, true, 3);
  for (Time t = 4; s.step_d(t) > 0; ++t) CHECK(s.start(t).empty());  // the cancelled one never transfers
  CHECK(s.h.counters().cancelled_parked == 1);
  CHECK(s.empty());
}

TEST_CASE("1P1D lifecycle: cancel while receiving, synchronous abort: both sides freed now, the late completion is stale") {
  Pd s(make({{10, 4}}), 16, 16);
  s.arrive(0);
  s.step_p(0);
  const auto o = s.start(1);
  REQUIRE(o.size() == 1);
  CHECK(s.h.cancel(0, 2, true));
  CHECK(s.reqs[0].status == RequestStatus::Cancelled);
  CHECK(s.empty());                 // freed at once: the channel said it stopped writing
  CHECK(s.h.complete(o[0].ticket, true, 3) == Handoff::Outcome::Stale);
  CHECK(s.h.counters().stale == 1);
  CHECK(s.empty());
}

TEST_CASE("1P1D lifecycle: cancel while receiving, deferred abort: blocks held until the channel's completion") {
  Pd s(make({{10, 4}}), 16, 16);
  s.arrive(0);
  s.step_p(0);
  const auto o = s.start(1);
  CHECK_FALSE(s.h.cancel(0, 2, false));
  CHECK(s.reqs[0].status == RequestStatus::Cancelled);  // the client sees it end now
  CHECK(s.reqs[0].finish == 2);
  CHECK(s.kp.used_blocks() == 3);   // a late write could still land in either side's blocks
  CHECK(s.kd.used_blocks() == 3);
  CHECK(s.h.open_tickets() == 1);
  CHECK(s.step_d(3) == 0);          // and D does not decode it
  // The channel ends it (its data arrived anyway): both sides go, the request stays cancelled.
  CHECK(s.h.complete(o[0].ticket, true, 4) == Handoff::Outcome::Cancelled);
  CHECK(s.reqs[0].status == RequestStatus::Cancelled);
  CHECK(s.h.counters().aborted == 1);
  CHECK(s.empty());
}

TEST_CASE("1P1D lifecycle: a failed transfer fails the request with a reason and frees both sides") {
  Pd s(make({{10, 4}, {6, 3}}), 16, 16);
  s.arrive(0);
  s.arrive(1);
  s.step_p(0);
  const auto o = s.start(1);
  REQUIRE(o.size() == 2);
  CHECK(s.h.complete(o[0].ticket, false, 2) == Handoff::Outcome::Failed);
  CHECK(s.reqs[0].status == RequestStatus::Failed);
  CHECK(s.reqs[0].fail_reason == FailReason::TransferFailed);
  CHECK(s.h.complete(o[1].ticket, true, 2) == Handoff::Outcome::Delivered);
  for (Time t = 3; s.step_d(t) > 0; ++t) {
  }
  CHECK(s.reqs[1].status == RequestStatus::Finished);
  CHECK(s.empty());
}

TEST_CASE("1P1D lifecycle: a request that fits P but never D fails at arrival; a one-token request never transfers") {
  Pd s(make({{10, 40}, {10, 1}}), 16, 8);  // request 0's life: 50 tokens = 13 blocks > D's 8
  CHECK(s.h.arrival_failure(s.reqs[0]) == FailReason::ExceedsDecodeKvCapacity);
  s.arrive(0);
  CHECK(s.reqs[0].status == RequestStatus::Failed);
  CHECK(s.reqs[0].fail_reason == FailReason::ExceedsDecodeKvCapacity);
  s.arrive(1);
  s.step_p(0);
  CHECK(s.reqs[1].status == RequestStatus::Finished);  // its only token came from P
  CHECK(s.start(1).empty());
  CHECK(s.h.counters().started == 0);
  CHECK(s.empty());
}
