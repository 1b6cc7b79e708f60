// The scheduler (policies/scheduler): its rules case by case, stage by stage.
#include <doctest/doctest.h>

#include <stdexcept>
#include <vector>

#include "core/rng.h"
#include "policies/block_pool.h"
#include "policies/scheduler.h"
#include "tests/policies_helpers.h"

using namespace tandem;
using namespace tandem::testing;

TEST_CASE("continuous: a finished request frees its blocks at once and a waiting one takes its seat") {
  auto reqs = make({{16, 1}, {16, 5}, {16, 2}});
  KvCache kv(3, 16, -1, 3);  // room for one request's lifetime (2 blocks) plus one block
  Scheduler s(Cfg(BatchingPolicy::Continuous, 8, 1000).chunked(false), reqs, kv);
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
  Scheduler s(Cfg(BatchingPolicy::Continuous, 8, 120).chunked(false), reqs, kv);
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

// vLLM v0's step composition, step by step: a prompt that can be admitted takes the step alone
// and every running decode waits for it; a step with nothing to admit runs the decodes.
TEST_CASE("prompts_or_decodes: decodes stall while a waiting prompt runs, and resume the step after") {
  auto reqs = make({{20, 4}, {30, 4}, {10, 4}, {500, 2}});
  KvCache kv(1000, 16, -1, 4);
  Scheduler s(
      Cfg(BatchingPolicy::Continuous, 8, 100).chunked(false).composition(StepComposition::PromptsOrDecodes), reqs,
      kv);
  REQUIRE(s.add_request(0, 0));
  const StepPlan& p0 = s.schedule(0);  // request 0's prompt
  REQUIRE(p0.seqs.size() == 1);
  CHECK(p0.num_prefill_seqs == 1);
  s.complete_step(1);
  CHECK(reqs[0].generated == 1);
  const StepPlan& p1 = s.schedule(1);  // nothing waits: request 0 decodes
  REQUIRE(p1.seqs.size() == 1);
  CHECK(p1.num_decode_seqs == 1);
  s.complete_step(2);
  // Two prompts arrive: both take the next step (30 + 10 tokens fit the budget of 100), and
  // request 0, ready to decode, is left out of it.
  REQUIRE(s.add_request(1, 2));
  REQUIRE(s.add_request(2, 2));
  const StepPlan& p2 = s.schedule(2);
  REQUIRE(p2.seqs.size() == 2);
  CHECK(p2.num_decode_seqs == 0);
  CHECK(p2.num_prefill_seqs == 2);
  CHECK(p2.seqs[0].id == 1);
  CHECK(p2.seqs[1].id == 2);
  CHECK(s.num_running() == 3);  // request 0 still holds its seat and its KV
  s.complete_step(3);
  CHECK(reqs[0].generated == 2);  // stalled: no token in that step
  const StepPlan& p3 = s.schedule(3);  // all three decode together
  CHECK(p3.seqs.size() == 3);
  CHECK(p3.num_decode_seqs == 3);
  s.complete_step(4);
  // A prompt over the budget could never run unchunked: it fails at arrival and stalls nobody.
  CHECK_FALSE(s.add_request(3, 4));
  CHECK(reqs[3].fail_reason == FailReason::PromptOverBudget);
  CHECK(s.schedule(4).num_decode_seqs == 3);
}

TEST_CASE("prompts_or_decodes vs mixed: the same arrivals, the mixed step carries the decode with the prompt") {
  for (const StepComposition c : {StepComposition::Mixed, StepComposition::PromptsOrDecodes}) {
    CAPTURE(to_string(c));
    auto reqs = make({{20, 3}, {30, 3}});
    KvCache kv(1000, 16, -1, 2);
    Scheduler s(Cfg(BatchingPolicy::Continuous, 8, 100).chunked(false).composition(c), reqs, kv);
    s.add_request(0, 0);
    s.schedule(0);
    s.complete_step(1);
    s.add_request(1, 1);
    const StepPlan& p = s.schedule(1);
    CHECK(p.num_prefill_seqs == 1);
    CHECK(p.num_decode_seqs == (c == StepComposition::Mixed ? 1 : 0));
    s.complete_step(2);
    // Both finish; the stalled decode finishes one step later.
    const int steps = 2 + drain(s, 2);
    CHECK(reqs[0].status == RequestStatus::Finished);
    CHECK(reqs[1].status == RequestStatus::Finished);
    CHECK(reqs[0].finish == (c == StepComposition::Mixed ? 2 : 3));
    CHECK(steps == 4);
  }
}

TEST_CASE("prompts_or_decodes: a prompt that finds no seat or no KV lets the decodes run") {
  auto reqs = make({{16, 8}, {16, 8}, {16, 8}});
  KvCache kv(3, 16, -1, 3);  // request 0's life takes 2 blocks; request 1 would need 2 more
  Scheduler s(
      Cfg(BatchingPolicy::Continuous, 8, 100).chunked(false).composition(StepComposition::PromptsOrDecodes), reqs,
      kv);
  s.add_request(0, 0);
  s.schedule(0);
  s.complete_step(1);
  s.add_request(1, 1);
  const StepPlan& p = s.schedule(1);
  REQUIRE(p.seqs.size() == 1);
  CHECK(p.seqs[0].id == 0);  // the decode runs: the waiting prompt cannot be admitted
  CHECK(p.num_decode_seqs == 1);
  CHECK(s.num_waiting() == 1);
}

TEST_CASE("prompts_or_decodes needs chunked prefill off") {
  auto reqs = make({{16, 1}});
  KvCache kv(10, 16, -1, 1);
  CHECK_THROWS_AS(
      Scheduler(Cfg(BatchingPolicy::Continuous, 8, 100).chunked(true).composition(StepComposition::PromptsOrDecodes),
                reqs, kv),
      std::invalid_argument);
}

TEST_CASE("static: the batch leaves together and nobody joins while it runs") {
  auto reqs = make({{8, 1}, {8, 3}, {8, 1}});
  KvCache kv(100, 4, -1, 3);
  Scheduler s(Cfg(BatchingPolicy::Static, 2, 1000).chunked(false), reqs, kv);
  for (ReqId i = 0; i < 3; ++i) s.add_request(i, 0);
  REQUIRE(s.schedule(0).seqs.size() == 2);  // batch of max_num_seqs = 2
  CHECK(s.complete_step(1).empty());        // request 0 is done but waits for its batch
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

TEST_CASE(
    "static: a member that has generated everything and is cancelled between steps reads finished, as during a step") {
  for (const bool during_step : {false, true}) {
    CAPTURE(during_step);
    auto reqs = make({{8, 1}, {8, 3}});
    KvCache kv(100, 4, -1, 2);
    Scheduler s(Cfg(BatchingPolicy::Static, 2, 1000).chunked(false), reqs, kv);
    for (ReqId i = 0; i < 2; ++i) s.add_request(i, 0);
    s.schedule(0);
    CHECK(s.complete_step(1).empty());  // request 0 has its one token and waits for its batch
    if (during_step) {
      s.schedule(1);
      CHECK_FALSE(s.cancel(0, 1));  // leaves when the step ends
      CHECK(s.complete_step(2).size() == 1);
    } else {
      CHECK(s.cancel(0, 1));  // leaves now
    }
    CHECK(reqs[0].status == RequestStatus::Finished);
    CHECK(reqs[0].generated == 1);
    CHECK(kv.reserved_blocks(0) == 0);
  }
}

TEST_CASE("requests that can never run fail at arrival with a reason") {
  auto reqs = make({{0, 4}, {4, 0}, {100, 30}, {60, 10}, {40, 5}, {10, 10}});
  KvCache kv(4, 16, -1, 6);  // 64 tokens of KV
  Scheduler s(Cfg(BatchingPolicy::Continuous, 8, 30).max_len(120).chunked(false), reqs, kv);
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
  Scheduler s(Cfg(BatchingPolicy::Continuous, 8, 50).max_len(120).chunked(false), reqs, kv);
  CHECK_FALSE(s.add_request(0, 0));
  CHECK(reqs[0].fail_reason == FailReason::NoStateSlots);
}

TEST_CASE("cancellation releases the reservation: waiting, running, and in flight") {
  auto reqs = make({{16, 10}, {16, 10}, {16, 10}});
  KvCache kv(6, 16, -1, 3);  // each request reserves 2 blocks
  Scheduler s(Cfg(BatchingPolicy::Continuous, 8, 1000).chunked(false), reqs, kv);
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
  Scheduler s(Cfg(BatchingPolicy::Continuous, 8, 1000).chunked(false), reqs, kv);
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

TEST_CASE("chunked: a long prompt is cut to the budget; decodes interleave; only the last chunk samples") {
  auto reqs = make({{10, 6}, {100, 3}});
  KvCache kv(100, 16, -1, 2);
  Scheduler s(Cfg(BatchingPolicy::Continuous, 8, 40).chunked(true).partials(1), reqs, kv);
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
    Scheduler s(Cfg(BatchingPolicy::Continuous, 8, 30).chunked(true).partials(1), reqs, kv);
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
    Scheduler s(Cfg(BatchingPolicy::Continuous, 8, 60).chunked(true).partials(2), reqs, kv);
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
    Scheduler s(Cfg(BatchingPolicy::Continuous, 8, 64).chunked(true).partials(2), r2, kv2);
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
    Scheduler s(Cfg(BatchingPolicy::Continuous, 8, 30).chunked(true).partials(1), r2, kv2);
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
  Scheduler s(Cfg(BatchingPolicy::Continuous, 8, 32).chunked(true).partials(1), reqs, kv);
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
  Scheduler s2(Cfg(BatchingPolicy::Continuous, 8, 32).chunked(true).partials(1), r2, kv2);
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
  Scheduler s_on(Cfg(BatchingPolicy::Continuous, 8, 16).chunked(true).partials(1), on, kv_on);
  Scheduler s_off(Cfg(BatchingPolicy::Continuous, 8, 16).chunked(false).partials(1), off, kv_off);
  CHECK(s_on.add_request(0, 0));
  CHECK_FALSE(s_off.add_request(0, 0));
  CHECK(off[0].fail_reason == FailReason::PromptOverBudget);
  CHECK(drain(s_on) == 7 + 1);  // ceil(100/16) = 7 chunks (the last samples), then 1 decode
  CHECK(on[0].status == RequestStatus::Finished);
}

TEST_CASE("chunked static: the batch still admits only into an empty engine") {
  auto reqs = make({{40, 2}, {40, 2}, {8, 1}});
  KvCache kv(100, 16, -1, 3);
  Scheduler s(Cfg(BatchingPolicy::Static, 8, 50).chunked(true).partials(1), reqs, kv);
  for (ReqId i = 0; i < 3; ++i) s.add_request(i, 0);
  const StepPlan& p = s.schedule(0);  // 40 + first 10 of the second; the third waits for the next batch
  REQUIRE(p.seqs.size() == 2);
  s.complete_step(1);
  const StepPlan& q = s.schedule(1);
  REQUIRE(q.seqs.size() == 2);  // decode 0 + last 30 of 1; request 2 does not join
  CHECK(s.num_waiting() == 1);
}

TEST_CASE("prefix caching: a later request takes the computed prefix; the last prompt token is always computed") {
  // Block size 4. Request 0: 12 tokens (3 full blocks). 1: the same 12 tokens. 2: those 12 and one more.
  // 3: the first 8 and 4 of its own.
  auto reqs = make({{12, 2}, {12, 2}, {13, 2}, {12, 2}});
  const std::vector<std::vector<BlockHash>> h = {hashes({1, 2, 3}), hashes({1, 2, 3}), hashes({1, 2, 3}),
                                                 hashes({1, 2, 9})};
  KvCache kv(40, 4, -1, 4);
  Scheduler s(Cfg(BatchingPolicy::Continuous, 8, 100).chunked(true).partials(1).caching(true), reqs, kv);
  REQUIRE(s.add_request(0, 0, h[0]));
  const StepPlan& p0 = s.schedule(0);
  REQUIRE(p0.seqs.size() == 1);
  CHECK(kv.cached_blocks() == 0);  // published when the step is done, not when planned
  s.complete_step(1);
  CHECK(kv.cached_blocks() == 3);
  for (ReqId i = 1; i < 4; ++i) REQUIRE(s.add_request(i, 1, h[size_t(i)]));
  const StepPlan& p1 = s.schedule(1);
  REQUIRE(p1.seqs.size() == 4);
  // 1: whole prompt cached, but (12 - 1) / 4 = 2 blocks at most: the last block is recomputed.
  CHECK(p1.seqs[1].id == 1);
  CHECK(reqs[1].num_cached_tokens == 8);
  CHECK(p1.seqs[1].num_computed_before == 8);
  CHECK(p1.seqs[1].num_tokens == 4);
  CHECK(p1.seqs[1].samples);
  CHECK(vec(p1.seqs[1].block_table).size() == 3);
  CHECK(p1.seqs[1].block_table[0] == 0);
  CHECK(p1.seqs[1].block_table[1] == 1);
  CHECK(p1.seqs[1].block_table[2] != 2);  // a new block for the recomputed one
  // 2: (13 - 1) / 4 = 3 blocks: one token left to compute.
  CHECK(reqs[2].num_cached_tokens == 12);
  CHECK(p1.seqs[2].num_tokens == 1);
  CHECK(vec(p1.seqs[2].block_table).size() == 4);
  // 3: shares two blocks.
  CHECK(reqs[3].num_cached_tokens == 8);
  CHECK(p1.seqs[3].num_tokens == 4);
  CHECK(p1.num_tokens == 1 + 4 + 1 + 4);
  CHECK(kv.pool().ref_count(0) == 4);
  CHECK(kv.pool().ref_count(2) == 2);
  s.complete_step(2);
  // 1's recomputed last block has the hash 0's block 2 already holds: it stays unpublished.
  CHECK(kv.cached_blocks() == 4);  // + request 3's block (hash 9)
  CHECK_FALSE(kv.pool().is_published(p1.seqs[1].block_table[2]));
  drain(s, 2);
  CHECK(kv.used_blocks() == 0);
  CHECK(kv.reserved_remaining() == 0);
  CHECK(kv.cached_blocks() == 4);
}

TEST_CASE("prefix caching: a chunked prompt shares its finished blocks at once; a cancelled one's blocks stay cached") {
  auto reqs = make({{40, 4}, {40, 4}, {40, 4}});
  const auto h = hashes({1, 2, 3, 4, 5});  // block size 8
  KvCache kv(40, 8, -1, 3);
  Scheduler s(Cfg(BatchingPolicy::Continuous, 8, 20).chunked(true).partials(2).caching(true), reqs, kv);
  REQUIRE(s.add_request(0, 0, h));
  s.schedule(0);  // 10 of 40 (the cap is 20 / 2)
  s.complete_step(1);
  CHECK(kv.cached_blocks() == 1);  // 10 tokens: one full block
  REQUIRE(s.add_request(1, 1, h));
  const StepPlan& p = s.schedule(1);  // 0: 10 more; 1: takes block 0, then 10 of its own
  REQUIRE(p.seqs.size() == 2);
  CHECK(reqs[1].num_cached_tokens == 8);
  CHECK(p.seqs[1].num_computed_before == 8);
  CHECK(p.seqs[1].block_table[0] == p.seqs[0].block_table[0]);
  CHECK_FALSE(s.cancel(0, 1));  // in flight: its blocks are published first, then released
  auto left = s.complete_step(2);
  REQUIRE(left.size() == 1);
  CHECK(reqs[0].status == RequestStatus::Cancelled);
  CHECK(kv.cached_blocks() == 2);      // 0's 20 tokens: two full blocks; 1's 18 tokens add none new
  CHECK(kv.pool().ref_count(0) == 1);  // still held by 1
  REQUIRE(s.add_request(2, 2, h));
  s.schedule(2);
  CHECK(reqs[2].num_cached_tokens == 16);
  s.complete_step(3);
  CHECK(s.cancel(1, 3));  // between steps: released at once
  drain(s, 3);
  CHECK(reqs[2].status == RequestStatus::Finished);
  CHECK(kv.used_blocks() == 0);
  CHECK(kv.reserved_remaining() == 0);
}

TEST_CASE("prefix caching off, or no hashes: stage 2 exactly") {
  auto on = make({{12, 2}, {12, 2}});
  auto off = on, none = on;
  const auto h = hashes({1, 2, 3});
  KvCache k_on(40, 4, -1, 2), k_off(40, 4, -1, 2), k_none(40, 4, -1, 2);
  Scheduler s_on(Cfg(BatchingPolicy::Continuous, 8, 100).chunked(true).partials(1).caching(true), on, k_on);
  Scheduler s_off(Cfg(BatchingPolicy::Continuous, 8, 100).chunked(true).partials(1).caching(false), off, k_off);
  Scheduler s_none(Cfg(BatchingPolicy::Continuous, 8, 100).chunked(true).partials(1).caching(true), none, k_none);
  for (Scheduler* s : {&s_on, &s_off, &s_none}) {
    const bool hashed = s != &s_none;
    s->add_request(0, 0, hashed ? h : std::vector<BlockHash>{});
    s->schedule(0);
    s->complete_step(1);
    s->add_request(1, 1, hashed ? h : std::vector<BlockHash>{});
    s->schedule(1);
    s->complete_step(2);
  }
  CHECK(on[1].num_cached_tokens == 8);
  CHECK(off[1].num_cached_tokens == 0);
  CHECK(none[1].num_cached_tokens == 0);
  CHECK(k_on.cached_blocks() == 3);
  CHECK(k_off.cached_blocks() == 0);
  CHECK(k_none.cached_blocks() == 0);
}

TEST_CASE("private blocks: cached and evicted exactly like unique hashes, never found") {
  BlockPool pool(3);
  const int32_t a = pool.allocate(), b = pool.allocate();
  CHECK(pool.publish(a, kPrivateBlock));
  CHECK(pool.publish(b, kPrivateBlock));  // many private blocks at once, no duplicate rule
  CHECK(pool.is_published(a));
  CHECK(pool.num_cached() == 2);
  CHECK(pool.find(kPrivateBlock) == -1);
  pool.release(a);
  pool.release(b);
  CHECK(pool.allocate() == 2);  // the never-used block first, then the cached ones in LRU order
  CHECK(pool.allocate() == a);
  CHECK(pool.num_evictions() == 1);
  CHECK(pool.num_cached() == 1);

  for (uint64_t seed = 1; seed <= 40; ++seed) {
    Rng rng(seed);
    const int n = int(rng.uniform_int(4, 30));
    const int32_t bs = 4;
    std::vector<Request> reqs(static_cast<size_t>(n));
    std::vector<std::vector<BlockHash>> priv(reqs.size()), uniq(reqs.size());
    for (int i = 0; i < n; ++i) {
      Request& r = reqs[size_t(i)];
      r.id = i;
      r.prompt_len = int32_t(rng.uniform_int(1, 60));
      r.max_output = int32_t(rng.uniform_int(1, 20));
      // A shared head from one of two groups, then the request's own blocks.
      const int shared = int(rng.uniform_int(0, r.prompt_len / bs));
      const uint64_t group = rng.uniform_int(1, 2);
      for (int k = 0; k < r.prompt_len / bs; ++k) {
        const BlockHash own{rng.next() | 1, rng.next()};
        priv[size_t(i)].push_back(k < shared ? BlockHash{group * 1000 + uint64_t(k), 7} : kPrivateBlock);
        uniq[size_t(i)].push_back(k < shared ? BlockHash{group * 1000 + uint64_t(k), 7} : own);
      }
    }
    std::vector<Request> ra = reqs, rb = reqs;
    const int32_t blocks = int32_t(rng.uniform_int(20, 60));
    KvCache ka(blocks, bs, -1, n), kb(blocks, bs, -1, n);
    const SchedulerConfig cfg = Cfg(BatchingPolicy::Continuous, 6, 48).chunked(true).partials(1).caching(true);
    Scheduler sa(cfg, ra, ka), sb(cfg, rb, kb);
    for (int i = 0; i < n; ++i) {
      REQUIRE(sa.add_request(i, 0, priv[size_t(i)]) == sb.add_request(i, 0, uniq[size_t(i)]));
    }
    for (int step = 1; step < 2000; ++step) {
      const StepPlan& pa = sa.schedule(step);
      const StepPlan& pb = sb.schedule(step);
      REQUIRE(pa.seqs.size() == pb.seqs.size());
      for (size_t k = 0; k < pa.seqs.size(); ++k) {
        REQUIRE(pa.seqs[k].id == pb.seqs[k].id);
        REQUIRE(pa.seqs[k].num_computed_before == pb.seqs[k].num_computed_before);
        REQUIRE(std::vector<int32_t>(pa.seqs[k].block_table.begin(), pa.seqs[k].block_table.end()) ==
                std::vector<int32_t>(pb.seqs[k].block_table.begin(), pb.seqs[k].block_table.end()));
      }
      if (pa.empty()) break;
      sa.complete_step(step);
      sb.complete_step(step);
      REQUIRE(ka.evictions() == kb.evictions());
      REQUIRE(ka.cached_blocks() == kb.cached_blocks());
    }
    for (int i = 0; i < n; ++i) CHECK(ra[size_t(i)].num_cached_tokens == rb[size_t(i)].num_cached_tokens);
  }
}
