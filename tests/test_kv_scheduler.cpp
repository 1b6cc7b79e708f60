// KV reservations at block boundaries and the scheduler's rules, case by case.
#include <doctest/doctest.h>

#include <vector>

#include "policies/scheduler.h"

using namespace tandem;

namespace {
std::vector<Request> make(std::vector<std::pair<int, int>> prompt_output) {
  std::vector<Request> v;
  for (size_t i = 0; i < prompt_output.size(); ++i) {
    Request r;
    r.id = ReqId(i);
    r.prompt_len = prompt_output[i].first;
    r.max_output = prompt_output[i].second;
    v.push_back(r);
  }
  return v;
}
// Run steps until no plan; returns the number of steps.
int drain(Scheduler& s, Time t0 = 0) {
  int n = 0;
  for (Time t = t0; !s.schedule(t).empty(); ++t, ++n) s.complete_step(t);
  return n;
}
}  // namespace

TEST_CASE("blocks_for rounds up at block boundaries") {
  KvCache kv(10, 16, -1, 1);
  CHECK(kv.blocks_for(0) == 0);
  CHECK(kv.blocks_for(1) == 1);
  CHECK(kv.blocks_for(16) == 1);
  CHECK(kv.blocks_for(17) == 2);
  CHECK(kv.blocks_for(32) == 2);
  CHECK(kv.blocks_for(33) == 3);
}

TEST_CASE("reservation: a lifetime of exactly the free blocks is admitted, one token more is not") {
  KvCache kv(4, 16, -1, 3);
  CHECK(kv.can_admit(64));   // 4 blocks
  CHECK_FALSE(kv.can_admit(65));
  kv.admit(0, 33);  // 3 blocks reserved, none held yet
  CHECK(kv.headroom() == 1);
  CHECK(kv.reserved_remaining() == 3);
  CHECK(kv.can_admit(16));
  CHECK_FALSE(kv.can_admit(17));
  // Growing within the reservation leaves the headroom unchanged.
  kv.ensure_capacity(0, 17);
  CHECK(kv.used_blocks() == 2);
  CHECK(kv.reserved_remaining() == 1);
  CHECK(kv.headroom() == 1);
  kv.ensure_capacity(0, 33);
  CHECK(kv.headroom() == 1);
  CHECK_THROWS(kv.ensure_capacity(0, 49));  // past its reservation: a bug, not a wait
  kv.release(0);
  CHECK(kv.free_blocks() == 4);
  CHECK(kv.reserved_remaining() == 0);
  CHECK(kv.headroom() == 4);
}

TEST_CASE("release of a partly grown request returns the unused reservation") {
  KvCache kv(8, 4, -1, 2);
  kv.admit(0, 20);  // 5 blocks
  kv.ensure_capacity(0, 5);  // 2 held, 3 outstanding
  CHECK(kv.headroom() == 3);
  kv.release(0);
  CHECK(kv.headroom() == 8);
  CHECK(kv.free_blocks() == 8);
}

TEST_CASE("freed blocks are reused last (FIFO free list)") {
  KvCache kv(4, 1, -1, 2);
  kv.admit(0, 2);
  kv.ensure_capacity(0, 2);  // blocks 0, 1
  kv.release(0);             // free list: 2 3 0 1
  kv.admit(1, 3);
  kv.ensure_capacity(1, 3);
  auto t = kv.block_table(1);
  CHECK(std::vector<int32_t>(t.begin(), t.end()) == std::vector<int32_t>{2, 3, 0});
}

TEST_CASE("state slots: admission stops when they run out, release returns one") {
  KvCache kv(100, 16, 1, 2);
  CHECK(kv.can_admit(10));
  kv.admit(0, 10);
  CHECK_FALSE(kv.can_admit(10));
  kv.release(0);
  CHECK(kv.can_admit(10));
}

TEST_CASE("continuous: a finished request frees its blocks at once and a waiting one takes its seat") {
  auto reqs = make({{16, 1}, {16, 5}, {16, 2}});
  KvCache kv(3, 16, -1, 3);  // room for one request's lifetime (2 blocks) plus one block
  Scheduler s({BatchingPolicy::Continuous, 8, 1000, 1 << 20, false}, reqs, kv);
  for (ReqId i = 0; i < 3; ++i) REQUIRE(s.add_request(i, 0));
  const StepPlan& p0 = s.schedule(0);
  REQUIRE(p0.seqs.size() == 1);  // request 0 holds 2 blocks reserved; request 1 needs 2 more: no
  CHECK(p0.seqs[0].id == 0);
  auto left = s.complete_step(1);
  REQUIRE(left.size() == 1);  // one output token: done after prefill
  CHECK(reqs[0].status == RequestStatus::Finished);
  CHECK(reqs[0].finish == 1);
  CHECK(kv.free_blocks() == 3);
  const StepPlan& p1 = s.schedule(1);
  REQUIRE(p1.seqs.size() == 1);
  CHECK(p1.seqs[0].id == 1);  // FCFS: request 1 first
}

TEST_CASE("continuous: head-of-line request blocks the queue (no overtaking)") {
  auto reqs = make({{100, 4}, {90, 4}, {5, 4}});
  KvCache kv(1000, 16, -1, 3);
  Scheduler s({BatchingPolicy::Continuous, 8, 120, 1 << 20, false}, reqs, kv);
  for (ReqId i = 0; i < 3; ++i) s.add_request(i, 0);
  const StepPlan& p = s.schedule(0);
  // 100 fits the 120-token budget; 90 does not fit the 20 left, and 5 may not overtake it.
  REQUIRE(p.seqs.size() == 1);
  CHECK(p.num_tokens == 100);
  s.complete_step(1);
  const StepPlan& p2 = s.schedule(1);
  CHECK(p2.seqs.size() == 3);  // 1 decode + 90 + 5 = 96 tokens
  CHECK(p2.num_tokens == 96);
  CHECK(p2.num_decode_seqs == 1);
  CHECK(p2.num_prefill_seqs == 2);
}

TEST_CASE("static: the batch leaves together and nobody joins while it runs") {
  auto reqs = make({{8, 1}, {8, 3}, {8, 1}});
  KvCache kv(100, 4, -1, 3);
  Scheduler s({BatchingPolicy::Static, 2, 1000, 1 << 20, false}, reqs, kv);
  for (ReqId i = 0; i < 3; ++i) s.add_request(i, 0);
  REQUIRE(s.schedule(0).seqs.size() == 2);  // batch of max_num_seqs = 2
  CHECK(s.complete_step(1).empty());         // request 0 is done but waits for its batch
  CHECK(reqs[0].status == RequestStatus::Running);
  const StepPlan& p = s.schedule(1);
  REQUIRE(p.seqs.size() == 1);  // only request 1 decodes; request 2 must not join
  CHECK(p.seqs[0].id == 1);
  CHECK(s.complete_step(2).empty());
  s.schedule(2);
  auto left = s.complete_step(3);
  CHECK(left.size() == 2);
  CHECK(reqs[0].finish == 3);  // left with its batch
  CHECK(reqs[1].finish == 3);
  const StepPlan& p3 = s.schedule(3);
  REQUIRE(p3.seqs.size() == 1);
  CHECK(p3.seqs[0].id == 2);
}

TEST_CASE("requests that can never run fail at arrival with a reason") {
  auto reqs = make({{0, 4}, {4, 0}, {100, 30}, {60, 10}, {40, 5}, {10, 10}});
  KvCache kv(4, 16, -1, 6);  // 64 tokens of KV
  Scheduler s({BatchingPolicy::Continuous, 8, 30, 120, false}, reqs, kv);
  CHECK_FALSE(s.add_request(0, 0));
  CHECK(reqs[0].fail_reason == FailReason::EmptyPrompt);
  CHECK_FALSE(s.add_request(1, 0));
  CHECK(reqs[1].fail_reason == FailReason::EmptyOutput);
  CHECK_FALSE(s.add_request(2, 0));
  CHECK(reqs[2].fail_reason == FailReason::ExceedsMaxModelLen);
  CHECK_FALSE(s.add_request(3, 0));
  CHECK(reqs[3].fail_reason == FailReason::ExceedsKvCapacity);
  CHECK_FALSE(s.add_request(4, 0));
  CHECK(reqs[4].fail_reason == FailReason::PromptOverBudget);
  CHECK(s.add_request(5, 0));
  for (int i = 0; i < 5; ++i) CHECK(reqs[size_t(i)].status == RequestStatus::Failed);
  CHECK(drain(s) == 10);
  CHECK(reqs[5].status == RequestStatus::Finished);
}

TEST_CASE("zero state slots: every request fails instead of waiting forever") {
  auto reqs = make({{4, 4}});
  KvCache kv(4, 16, 0, 1);
  Scheduler s({BatchingPolicy::Continuous, 8, 50, 120, false}, reqs, kv);
  CHECK_FALSE(s.add_request(0, 0));
  CHECK(reqs[0].fail_reason == FailReason::NoStateSlots);
}

TEST_CASE("cancellation releases the reservation: waiting, running, and in flight") {
  auto reqs = make({{16, 10}, {16, 10}, {16, 10}});
  KvCache kv(6, 16, -1, 3);  // each request reserves 2 blocks
  Scheduler s({BatchingPolicy::Continuous, 8, 1000, 1 << 20, false}, reqs, kv);
  for (ReqId i = 0; i < 3; ++i) s.add_request(i, 0);
  CHECK(s.cancel(2, 0));  // waiting
  CHECK(reqs[2].status == RequestStatus::Cancelled);
  CHECK(s.num_waiting() == 2);
  REQUIRE(s.schedule(0).seqs.size() == 2);
  CHECK(kv.headroom() == 2);
  CHECK_FALSE(s.cancel(1, 0));  // in flight: leaves when the step ends
  auto left = s.complete_step(1);
  REQUIRE(left.size() == 1);
  CHECK(left[0] == 1);
  CHECK(reqs[1].status == RequestStatus::Cancelled);
  CHECK(kv.headroom() == 4);
  CHECK(s.cancel(0, 1));  // running, between steps
  CHECK(kv.headroom() == 6);
  CHECK(kv.free_blocks() == 6);
  CHECK(s.schedule(1).empty());
}

TEST_CASE("decode-only steps: one token per running request, no admission when nobody waits") {
  auto reqs = make({{30, 4}, {20, 4}});
  KvCache kv(100, 16, -1, 2);
  Scheduler s({BatchingPolicy::Continuous, 8, 1000, 1 << 20, false}, reqs, kv);
  s.add_request(0, 0);
  s.add_request(1, 0);
  s.schedule(0);
  s.complete_step(1);
  const StepPlan& p = s.schedule(1);
  REQUIRE(p.seqs.size() == 2);
  CHECK(p.num_tokens == 2);
  CHECK(p.num_decode_seqs == 2);
  CHECK(p.seqs[0].num_computed_before == 30);
  CHECK(p.seqs[0].block_table.size() == 2);  // position 30 is in block 1
  CHECK(p.seqs[1].num_computed_before == 20);
}

// ---- stage 2: chunked prefill ----

TEST_CASE("chunked: a long prompt is cut to the budget; decodes interleave; only the last chunk samples") {
  auto reqs = make({{10, 6}, {100, 3}});
  KvCache kv(100, 16, -1, 2);
  Scheduler s({BatchingPolicy::Continuous, 8, 40, 1 << 20, true, 1}, reqs, kv);
  REQUIRE(s.add_request(0, 0));
  REQUIRE(s.add_request(1, 0));  // 100 > 40: no failure at arrival with chunking
  const StepPlan& p0 = s.schedule(0);
  REQUIRE(p0.seqs.size() == 2);  // request 0 whole (10), request 1's first chunk (30)
  CHECK(p0.seqs[0].num_tokens == 10);
  CHECK(p0.seqs[0].samples);
  CHECK(p0.seqs[1].id == 1);
  CHECK(p0.seqs[1].num_tokens == 30);
  CHECK(p0.seqs[1].num_computed_before == 0);
  CHECK_FALSE(p0.seqs[1].samples);
  CHECK(p0.num_samples == 1);
  CHECK(p0.num_tokens == 40);
  CHECK(p0.seqs[1].block_table.size() == 2);  // blocks are taken as chunks compute: 30 tokens -> 2
  CHECK(kv.reserved_blocks(1) == 7);          // ... the whole life (103 tokens) is reserved at admission
  CHECK(s.partial_prefills().size() == 1);
  s.complete_step(1);
  CHECK(reqs[1].num_computed == 30);
  CHECK(reqs[1].generated == 0);
  const StepPlan& p1 = s.schedule(1);  // decode of 0 first, then 39 of request 1's prompt
  REQUIRE(p1.seqs.size() == 2);
  CHECK(p1.seqs[0].id == 0);
  CHECK(p1.seqs[0].num_tokens == 1);
  CHECK(p1.seqs[1].num_tokens == 39);
  CHECK(p1.seqs[1].num_computed_before == 30);
  CHECK_FALSE(p1.seqs[1].samples);
  CHECK(p1.num_decode_seqs == 1);
  CHECK(p1.num_prefill_seqs == 1);
  s.complete_step(2);
  const StepPlan& p2 = s.schedule(2);  // 1 decode + the last 31 prompt tokens, which sample
  REQUIRE(p2.seqs.size() == 2);
  CHECK(p2.seqs[1].num_tokens == 31);
  CHECK(p2.seqs[1].samples);
  s.complete_step(3);
  CHECK(reqs[1].first_token == kNever);  // timestamps are the engine's; the scheduler counts
  CHECK(reqs[1].generated == 1);
  CHECK(s.partial_prefills().empty());
  CHECK(drain(s, 3) > 0);
  CHECK(reqs[0].status == RequestStatus::Finished);
  CHECK(reqs[1].status == RequestStatus::Finished);
  CHECK(kv.free_blocks() == 100);
  CHECK(kv.reserved_remaining() == 0);
}

TEST_CASE("chunked: max_num_partial_prefills bounds prompts part-way; FCFS holds") {
  auto reqs = make({{50, 2}, {50, 2}, {5, 2}});
  KvCache kv(100, 16, -1, 3);
  SUBCASE("one at a time") {
    Scheduler s({BatchingPolicy::Continuous, 8, 30, 1 << 20, true, 1}, reqs, kv);
    for (ReqId i = 0; i < 3; ++i) s.add_request(i, 0);
    const StepPlan& p = s.schedule(0);
    REQUIRE(p.seqs.size() == 1);  // 0 takes the whole budget
    s.complete_step(1);
    const StepPlan& q = s.schedule(1);  // 0 finishes its prompt (20); 1 may start now (10), 2 waits behind it
    REQUIRE(q.seqs.size() == 2);
    CHECK(q.seqs[0].id == 0);
    CHECK(q.seqs[0].num_tokens == 20);
    CHECK(q.seqs[1].id == 1);
    CHECK(q.seqs[1].num_tokens == 10);
    CHECK(s.num_waiting() == 1);
  }
  SUBCASE("two at once: each prompt chunk takes at most half the budget") {
    Scheduler s({BatchingPolicy::Continuous, 8, 60, 1 << 20, true, 2}, reqs, kv);
    for (ReqId i = 0; i < 3; ++i) s.add_request(i, 0);
    const StepPlan& p = s.schedule(0);  // 0: 30 of 50, 1: 30 of 50 (the cap is 60 / 2)
    REQUIRE(p.seqs.size() == 2);        // two prompts part-way is the limit, and 2 may not overtake
    CHECK(p.seqs[0].num_tokens == 30);
    CHECK(p.seqs[1].num_tokens == 30);
    CHECK(s.partial_prefills().size() == 2);
    s.complete_step(1);
    const StepPlan& q = s.schedule(1);  // 20 + 20 finish both prompts (sampling); 5 of request 2 whole
    REQUIRE(q.seqs.size() == 3);
    CHECK(q.num_tokens == 45);
    CHECK(q.num_samples == 3);
  }
  SUBCASE("two at once: a short prompt starts beside a long one") {
    auto r2 = make({{200, 2}, {10, 2}});
    KvCache kv2(100, 16, -1, 2);
    Scheduler s({BatchingPolicy::Continuous, 8, 64, 1 << 20, true, 2}, r2, kv2);
    s.add_request(0, 0);
    s.add_request(1, 0);
    const StepPlan& p = s.schedule(0);  // long: 32; short: all 10, samples at once
    REQUIRE(p.seqs.size() == 2);
    CHECK(p.seqs[0].num_tokens == 32);
    CHECK(p.seqs[1].num_tokens == 10);
    CHECK(p.seqs[1].samples);
  }
  SUBCASE("a second part-way prompt is refused at one") {
    auto r2 = make({{50, 2}, {50, 2}});
    KvCache kv2(100, 16, -1, 2);
    Scheduler s({BatchingPolicy::Continuous, 8, 30, 1 << 20, true, 1}, r2, kv2);
    s.add_request(0, 0);
    s.add_request(1, 0);
    REQUIRE(s.schedule(0).seqs.size() == 1);
    s.complete_step(1);
    s.schedule(1);  // 0: last 20 (done); 1: first 10
    s.complete_step(2);
    const StepPlan& p = s.schedule(2);  // decode 0 + 29 of 1
    REQUIRE(p.seqs.size() == 2);
    CHECK(p.seqs[1].num_tokens == 29);
  }
}

TEST_CASE("chunked: cancelling a prompt mid-chunks releases its blocks and its reservation") {
  auto reqs = make({{100, 10}, {20, 2}});
  KvCache kv(20, 16, -1, 2);
  Scheduler s({BatchingPolicy::Continuous, 8, 32, 1 << 20, true, 1}, reqs, kv);
  s.add_request(0, 0);
  s.add_request(1, 0);
  s.schedule(0);
  CHECK_FALSE(s.cancel(0, 0));  // in flight: leaves when the step ends
  auto left = s.complete_step(1);
  REQUIRE(left.size() == 1);
  CHECK(reqs[0].status == RequestStatus::Cancelled);
  CHECK(s.partial_prefills().empty());
  CHECK(kv.free_blocks() == 20);
  CHECK(kv.reserved_remaining() == 0);
  const StepPlan& p = s.schedule(1);
  REQUIRE(p.seqs.size() == 1);
  CHECK(p.seqs[0].id == 1);
  s.complete_step(2);
  // Between steps.
  auto r2 = make({{100, 10}});
  KvCache kv2(20, 16, -1, 1);
  Scheduler s2({BatchingPolicy::Continuous, 8, 32, 1 << 20, true, 1}, r2, kv2);
  s2.add_request(0, 0);
  s2.schedule(0);
  s2.complete_step(1);
  CHECK(kv2.used_blocks() == 2);
  CHECK(s2.cancel(0, 1));
  CHECK(s2.partial_prefills().empty());
  CHECK(kv2.free_blocks() == 20);
  CHECK(kv2.reserved_remaining() == 0);
  CHECK(s2.schedule(1).empty());
}

TEST_CASE("chunked: a prompt over the budget fails at arrival only with chunking off") {
  auto on = make({{100, 2}});
  auto off = on;
  KvCache kv_on(100, 16, -1, 1), kv_off(100, 16, -1, 1);
  Scheduler s_on({BatchingPolicy::Continuous, 8, 16, 1 << 20, true, 1}, on, kv_on);
  Scheduler s_off({BatchingPolicy::Continuous, 8, 16, 1 << 20, false, 1}, off, kv_off);
  CHECK(s_on.add_request(0, 0));
  CHECK_FALSE(s_off.add_request(0, 0));
  CHECK(off[0].fail_reason == FailReason::PromptOverBudget);
  CHECK(drain(s_on) == 7 + 1);  // ceil(100/16) = 7 chunks (the last samples), then 1 decode
  CHECK(on[0].status == RequestStatus::Finished);
}

TEST_CASE("chunked static: the batch still admits only into an empty engine") {
  auto reqs = make({{40, 2}, {40, 2}, {8, 1}});
  KvCache kv(100, 16, -1, 3);
  Scheduler s({BatchingPolicy::Static, 8, 50, 1 << 20, true, 1}, reqs, kv);
  for (ReqId i = 0; i < 3; ++i) s.add_request(i, 0);
  const StepPlan& p = s.schedule(0);  // 40 + first 10 of the second; the third waits for the next batch
  REQUIRE(p.seqs.size() == 2);
  s.complete_step(1);
  const StepPlan& q = s.schedule(1);
  REQUIRE(q.seqs.size() == 2);  // decode 0 + last 30 of 1; request 2 does not join
  CHECK(s.num_waiting() == 1);
}
