// Differential test: the O(1)-admission scheduler against the naive reference on many
// seeded random workloads, comparing plans and KV state after every step.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include "policies/scheduler.h"
#include "sim/rng.h"
#include "tests/reference_scheduler.h"

using namespace tandem;
using tandem::testing::RefConfig;
using tandem::testing::ReferenceScheduler;
using tandem::testing::RefSeq;

namespace {

struct Case {
  RefConfig cfg;
  std::vector<Request> reqs;
  std::vector<int> arrive_at_step;
};

Case random_case(uint64_t seed) {
  Rng rng(seed);
  Case c;
  c.cfg.static_batching = rng.uniform() < 0.3;
  c.cfg.block_size = int(std::vector<int>{1, 2, 4, 16}[size_t(rng.uniform_int(0, 3))]);
  c.cfg.num_blocks = int(rng.uniform_int(4, 160));
  c.cfg.max_num_seqs = int(rng.uniform_int(1, 24));
  c.cfg.budget = int(rng.uniform_int(8, 600));
  c.cfg.max_model_len = rng.uniform() < 0.2 ? int(rng.uniform_int(50, 400)) : 1 << 30;
  c.cfg.state_slots = rng.uniform() < 0.2 ? int(rng.uniform_int(0, 6)) : -1;
  c.cfg.chunked = rng.uniform() < 0.6;
  c.cfg.max_partials = int(rng.uniform_int(1, 3));
  if (c.cfg.chunked && rng.uniform() < 0.5) c.cfg.budget = int(rng.uniform_int(8, 64));  // many chunks per prompt
  const int n = int(rng.uniform_int(1, 60));
  for (int i = 0; i < n; ++i) {
    Request r;
    r.id = i;
    r.prompt_len = int32_t(rng.uniform() < 0.03 ? 0 : rng.uniform_int(1, 300));
    r.max_output = int32_t(rng.uniform_int(1, 80));
    c.reqs.push_back(r);
    c.arrive_at_step.push_back(int(rng.uniform_int(0, 40)));
  }
  return c;
}

// A cancellation victim: any request, or (half the time, when there is one) a prompt part-way
// through its chunks, the case chunked prefill adds.
ReqId victim(Rng& rng, const Scheduler& s, size_t n) {
  if (!s.partial_prefills().empty() && rng.uniform() < 0.5) return s.partial_prefills().front();
  return ReqId(rng.uniform_int(0, int64_t(n) - 1));
}

std::vector<RefSeq> to_ref(const StepPlan& p) {
  std::vector<RefSeq> out;
  for (const auto& s : p.seqs) out.push_back({s.id, s.num_tokens, s.num_computed_before, s.samples, {s.block_table.begin(), s.block_table.end()}});
  return out;
}

}  // namespace

TEST_CASE("differential: O(1) admission scheduler == naive reference on 600 random workloads, chunked and not") {
  int64_t total_steps = 0, total_admitted = 0, mid_prompt_chunks = 0, mid_prompt_cancels = 0;
  for (uint64_t seed = 1; seed <= 600; ++seed) {
    Case c = random_case(seed);
    std::vector<Request> a = c.reqs, b = c.reqs;
    KvCache kv(c.cfg.num_blocks, c.cfg.block_size, c.cfg.state_slots, int32_t(a.size()));
    SchedulerConfig sc{c.cfg.static_batching ? BatchingPolicy::Static : BatchingPolicy::Continuous, c.cfg.max_num_seqs,
                       c.cfg.budget, c.cfg.max_model_len, c.cfg.chunked, c.cfg.max_partials};
    Scheduler fast(sc, a, kv);
    ReferenceScheduler ref(c.cfg, b);
    Rng rng(seed * 7919);
    INFO(fmt::format("seed {} static={} blocks={}x{} seqs={} budget={} slots={} chunked={} partials={}", seed,
                     c.cfg.static_batching, c.cfg.num_blocks, c.cfg.block_size, c.cfg.max_num_seqs, c.cfg.budget,
                     c.cfg.state_slots, c.cfg.chunked, c.cfg.max_partials));
    for (int step = 0; step < 5000; ++step) {
      for (size_t i = 0; i < a.size(); ++i)
        if (c.arrive_at_step[i] == step) REQUIRE(fast.add_request(ReqId(i), step) == ref.add(ReqId(i)));
      // Cancel someone now and then, before planning.
      if (rng.uniform() < 0.05) {
        const ReqId v = victim(rng, fast, a.size());
        mid_prompt_cancels += a[size_t(v)].status == RequestStatus::Running && a[size_t(v)].prefilling();
        REQUIRE(fast.cancel(v, step) == ref.cancel(v));
      }
      const StepPlan& p = fast.schedule(step);
      const auto rp = ref.schedule();
      REQUIRE(to_ref(p) == rp);
      total_admitted += p.num_prefill_seqs;
      for (const ScheduledSeq& sq : p.seqs) mid_prompt_chunks += !sq.samples;
      // ... and sometimes while the step is in flight.
      if (rng.uniform() < 0.05) {
        const ReqId v = victim(rng, fast, a.size());
        mid_prompt_cancels += a[size_t(v)].status == RequestStatus::Running && a[size_t(v)].prefilling();
        REQUIRE(fast.cancel(v, step) == ref.cancel(v));
      }
      REQUIRE(kv.free_blocks() == ref.free_blocks());
      REQUIRE(kv.reserved_remaining() == ref.outstanding());
      REQUIRE(kv.used_blocks() + kv.reserved_remaining() <= kv.num_blocks());
      std::vector<ReqId> left_fast;
      if (!p.empty()) {
        auto l = fast.complete_step(step);
        left_fast.assign(l.begin(), l.end());
        REQUIRE(left_fast == ref.complete());
        ++total_steps;
      }
      for (size_t i = 0; i < a.size(); ++i) {
        REQUIRE(a[i].status == b[i].status);
        REQUIRE(a[i].generated == b[i].generated);
        auto t = kv.block_table(ReqId(i));
        REQUIRE(std::vector<int>(t.begin(), t.end()) == ref.table(ReqId(i)));
      }
      bool all_gone = step > 40;
      for (const Request& r : a) all_gone = all_gone && !r.alive();
      if (all_gone) break;
    }
    for (const Request& r : a) REQUIRE_FALSE(r.alive());
  }
  MESSAGE("compared ", total_steps, " steps, ", total_admitted, " prefill seqs, ", mid_prompt_chunks,
          " chunks that stop mid-prompt, ", mid_prompt_cancels, " cancellations of a part-way prompt");
  CHECK(total_steps > 10000);
  CHECK(mid_prompt_chunks > 1000);
  CHECK(mid_prompt_cancels > 20);
}
