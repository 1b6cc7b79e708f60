// Differential test: the O(1)-admission scheduler against the naive reference on many
// seeded random workloads, comparing plans and KV state after every step.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include "core/rng.h"
#include "policies/scheduler.h"
#include "tests/policies_helpers.h"
#include "tests/reference_scheduler.h"

using namespace tandem;
using tandem::testing::RefConfig;
using tandem::testing::RefCounters;
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
  // Drawn last, so that the cases above are the ones earlier versions of this test drew.
  c.cfg.prompts_or_decodes = !c.cfg.chunked && rng.uniform() < 0.5;
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
  for (const auto& s : p.seqs)
    out.push_back({s.id, s.num_tokens, s.num_computed_before, s.samples, {s.block_table.begin(), s.block_table.end()}});
  return out;
}

}  // namespace

namespace {
// The scheduler under test configured as the reference.
SchedulerConfig fast_config(const RefConfig& cfg) {
  return testing::Cfg(cfg.static_batching ? BatchingPolicy::Static : BatchingPolicy::Continuous, cfg.max_num_seqs,
                      cfg.budget)
      .max_len(cfg.max_model_len)
      .chunked(cfg.chunked)
      .partials(cfg.max_partials)
      .caching(cfg.prefix_caching)
      .composition(cfg.prompts_or_decodes ? StepComposition::PromptsOrDecodes : StepComposition::Mixed);
}

// After every step: each request's status, progress and block table agree with the reference.
void require_same_requests(const std::vector<Request>& a, const std::vector<Request>& b, const KvCache& kv,
                           const ReferenceScheduler& ref) {
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].status == b[i].status);
    REQUIRE(a[i].generated == b[i].generated);
    REQUIRE(a[i].num_computed == b[i].num_computed);
    REQUIRE(a[i].num_cached_tokens == b[i].num_cached_tokens);
    auto t = kv.block_table(ReqId(i));
    REQUIRE(std::vector<int>(t.begin(), t.end()) == ref.table(ReqId(i)));
  }
}
}  // namespace

TEST_CASE("differential: O(1) admission scheduler == naive reference on 600 random workloads, chunked and not") {
  int64_t total_steps = 0, total_admitted = 0, mid_prompt_chunks = 0, mid_prompt_cancels = 0;
  int64_t stalled_decodes = 0;  // prompts_or_decodes: running requests left out of a prompt step
  for (uint64_t seed = 1; seed <= 600; ++seed) {
    Case c = random_case(seed);
    std::vector<Request> a = c.reqs, b = c.reqs;
    KvCache kv(c.cfg.num_blocks, c.cfg.block_size, c.cfg.state_slots, int32_t(a.size()));
    const SchedulerConfig sc = fast_config(c.cfg);
    Scheduler fast(sc, a, kv);
    ReferenceScheduler ref(c.cfg, b);
    Rng rng(seed * 7919);
    INFO(fmt::format("seed {} static={} blocks={}x{} seqs={} budget={} slots={} chunked={} partials={} "
                     "prompts_or_decodes={}",
                     seed, c.cfg.static_batching, c.cfg.num_blocks, c.cfg.block_size, c.cfg.max_num_seqs, c.cfg.budget,
                     c.cfg.state_slots, c.cfg.chunked, c.cfg.max_partials, c.cfg.prompts_or_decodes));
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
      if (c.cfg.prompts_or_decodes && p.num_prefill_seqs > 0) {
        REQUIRE(p.num_decode_seqs == 0);
        stalled_decodes += fast.num_running() - int64_t(p.seqs.size());
      }
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
      require_same_requests(a, b, kv, ref);
      bool all_gone = step > 40;
      for (const Request& r : a) all_gone = all_gone && !r.alive();
      if (all_gone) break;
    }
    for (const Request& r : a) REQUIRE_FALSE(r.alive());
  }
  MESSAGE("compared ", total_steps, " steps, ", total_admitted, " prefill seqs, ", mid_prompt_chunks,
          " chunks that stop mid-prompt, ", mid_prompt_cancels, " cancellations of a part-way prompt, ",
          stalled_decodes, " decodes stalled behind prompts (prompts_or_decodes)");
  CHECK(stalled_decodes > 100);
  CHECK(total_steps > 10000);
  CHECK(mid_prompt_chunks > 1000);
  CHECK(mid_prompt_cancels > 20);
}

// ---- stage 3: prefix caching ----

namespace {

// Prompts as token ids, hashed here the way the engine does (chained over full blocks), so
// that prompts sharing their first k tokens share their first k / bs block hashes.
std::vector<BlockHash> chain_hashes(const std::vector<uint32_t>& tokens, int bs) {
  std::vector<BlockHash> out;
  BlockHash h{0x7a6e64656d, 0x6b76};
  for (size_t b = 0; b + size_t(bs) <= tokens.size(); b += size_t(bs)) {
    for (size_t i = b; i < b + size_t(bs); ++i) {
      h.lo = hash_combine(h.lo, tokens[i]);
      h.hi = hash_combine(h.hi ^ 0x5bd1e995, tokens[i]);
    }
    out.push_back(h);
  }
  return out;
}

struct CacheCase {
  RefConfig cfg;
  std::vector<Request> reqs;
  std::vector<int> arrive_at_step;
  std::vector<std::vector<BlockHash>> hashes;  // what add_request gets (the scheduler keeps views)
};

CacheCase random_cache_case(uint64_t seed) {
  Rng rng(seed);
  CacheCase c;
  c.cfg.static_batching = rng.uniform() < 0.2;
  c.cfg.block_size = int(std::vector<int>{1, 2, 3, 4, 8, 16}[size_t(rng.uniform_int(0, 5))]);
  // Small caches half the time: cached blocks are evicted, and admissions price free hit blocks.
  c.cfg.num_blocks = int(rng.uniform() < 0.5 ? rng.uniform_int(4, 24) : rng.uniform_int(25, 128));
  c.cfg.max_num_seqs = int(rng.uniform_int(1, 16));
  c.cfg.max_model_len = rng.uniform() < 0.1 ? int(rng.uniform_int(20, 300)) : 1 << 30;
  c.cfg.state_slots = rng.uniform() < 0.1 ? int(rng.uniform_int(0, 5)) : -1;
  c.cfg.chunked = rng.uniform() < 0.7;
  c.cfg.max_partials = int(rng.uniform_int(1, 3));
  c.cfg.prefix_caching = rng.uniform() < 0.85;
  const int capacity = c.cfg.num_blocks * c.cfg.block_size;
  const int max_prompt = std::max(2, std::min(300, capacity * 3 / 4));
  c.cfg.budget = int(rng.uniform_int(8, 400));
  if (c.cfg.chunked && rng.uniform() < 0.6) c.cfg.budget = int(rng.uniform_int(std::max(1, c.cfg.block_size / 2), 48));
  const bool some_without_hashes = rng.uniform() < 0.1;  // caching on, but a request brings no hashes
  // A few groups of shared leading tokens (system prompts).
  std::vector<std::vector<uint32_t>> groups(size_t(rng.uniform_int(1, 4)));
  uint32_t next_token = 1;
  auto fresh = [&](std::vector<uint32_t>& v, int n) {
    for (int i = 0; i < n; ++i) v.push_back(next_token++);  // never seen before: no accidental sharing
  };
  for (auto& g : groups) fresh(g, int(rng.uniform_int(1, max_prompt)));
  std::vector<std::vector<uint32_t>> prompts;
  const int n = int(rng.uniform_int(1, 50));
  for (int i = 0; i < n; ++i) {
    std::vector<uint32_t> p;
    const double u = rng.uniform();
    const auto& earlier =
        prompts.empty() ? groups[0] : prompts[size_t(rng.uniform_int(0, int64_t(prompts.size()) - 1))];
    if (u < 0.15) {  // nothing shared
      fresh(p, int(rng.uniform_int(1, max_prompt)));
    } else if (u < 0.55) {  // a group's prefix of random length (block-aligned a third of the time), then its own turn
      const auto& g = groups[size_t(rng.uniform_int(0, int64_t(groups.size()) - 1))];
      int k = int(rng.uniform_int(0, int64_t(g.size())));
      if (rng.uniform() < 0.33)
        k = std::min(int(g.size()), k / c.cfg.block_size * c.cfg.block_size + int(rng.uniform_int(-1, 1)));
      k = std::max(k, 0);
      p.assign(g.begin(), g.begin() + k);
      fresh(p, int(rng.uniform_int(p.empty() ? 1 : 0, std::max(1, max_prompt - k))));
    } else if (u < 0.65) {  // the same prompt again
      p = earlier;
    } else if (u < 0.75) {  // all but the last token shared
      p = earlier;
      p.back() = next_token++;
    } else if (u < 0.85) {  // a prefix of an earlier prompt
      p.assign(earlier.begin(), earlier.begin() + rng.uniform_int(1, int64_t(earlier.size())));
    } else if (u < 0.93) {  // an earlier prompt extended (it is a prefix of this one)
      p = earlier;
      fresh(p, int(rng.uniform_int(1, std::max(1, c.cfg.block_size * 3))));
    } else {  // a whole group prompt, cut to a block boundary: all its blocks may be cached
      const auto& g = groups[size_t(rng.uniform_int(0, int64_t(groups.size()) - 1))];
      const size_t k = std::max<size_t>(1, g.size() / size_t(c.cfg.block_size) * size_t(c.cfg.block_size));
      p.assign(g.begin(), g.begin() + int64_t(std::min(k, g.size())));
    }
    prompts.push_back(p);
    Request r;
    r.id = ReqId(i);
    r.prompt_len = int32_t(rng.uniform() < 0.03 ? 0 : p.size());
    r.max_output = int32_t(rng.uniform_int(1, 40));
    c.reqs.push_back(r);
    c.arrive_at_step.push_back(int(rng.uniform_int(0, 60)));
    c.hashes.push_back(r.prompt_len == 0 || (some_without_hashes && rng.uniform() < 0.3)
                           ? std::vector<BlockHash>{}
                           : chain_hashes(p, c.cfg.block_size));
  }
  c.cfg.prompts_or_decodes = !c.cfg.chunked && rng.uniform() < 0.5;  // drawn last, as above
  return c;
}

std::vector<int> published_blocks(const KvCache& kv) {
  std::vector<int> out;
  for (int32_t b = 0; b < kv.num_blocks(); ++b)
    if (kv.pool().is_published(b)) out.push_back(b);
  return out;
}

}  // namespace

TEST_CASE(
    "differential: prefix caching == naive reference on 2000 random shared-prefix workloads, with cancellations") {
  int64_t total_steps = 0, cases_on = 0, cases_off = 0, admissions = 0, mid_prompt_cancels = 0, in_flight_cancels = 0;
  int64_t cached_tokens = 0, evictions = 0;
  RefCounters total;
  for (uint64_t seed = 1; seed <= 2000; ++seed) {
    CacheCase c = random_cache_case(seed * 1000003);
    (c.cfg.prefix_caching ? cases_on : cases_off)++;
    std::vector<Request> a = c.reqs, b = c.reqs;
    KvCache kv(c.cfg.num_blocks, c.cfg.block_size, c.cfg.state_slots, int32_t(a.size()));
    const SchedulerConfig sc = fast_config(c.cfg);
    Scheduler fast(sc, a, kv);
    ReferenceScheduler ref(c.cfg, b);
    Rng rng(seed * 7919 + 1);
    INFO(fmt::format(
        "seed {} caching={} static={} blocks={}x{} seqs={} budget={} slots={} chunked={} partials={} reqs={} "
        "prompts_or_decodes={}",
        seed, c.cfg.prefix_caching, c.cfg.static_batching, c.cfg.num_blocks, c.cfg.block_size, c.cfg.max_num_seqs,
        c.cfg.budget, c.cfg.state_slots, c.cfg.chunked, c.cfg.max_partials, a.size(), c.cfg.prompts_or_decodes));
    auto cancel_someone = [&](int step) {
      const ReqId v = victim(rng, fast, a.size());
      const bool mid_prompt = a[size_t(v)].status == RequestStatus::Running && a[size_t(v)].prefilling();
      mid_prompt_cancels += mid_prompt;
      in_flight_cancels += fast.in_flight() && a[size_t(v)].status == RequestStatus::Running;
      REQUIRE(fast.cancel(v, step) == ref.cancel(v));
    };
    int step = 0;
    for (; step < 5000; ++step) {
      INFO("step ", step);
      for (size_t i = 0; i < a.size(); ++i)
        if (c.arrive_at_step[i] == step)
          REQUIRE(fast.add_request(ReqId(i), step, c.hashes[i]) == ref.add(ReqId(i), c.hashes[i]));
      if (rng.uniform() < 0.04) cancel_someone(step);  // between steps
      const StepPlan& p = fast.schedule(step);
      const auto rp = ref.schedule();
      REQUIRE(to_ref(p) == rp);
      if (rng.uniform() < 0.04) cancel_someone(step);  // while the step is in flight
      REQUIRE(kv.free_blocks() == ref.free_blocks());
      REQUIRE(kv.reserved_remaining() == ref.outstanding());
      REQUIRE(kv.used_blocks() + kv.reserved_remaining() <= kv.num_blocks());
      if (!p.empty()) {
        auto l = fast.complete_step(step);
        REQUIRE(std::vector<ReqId>(l.begin(), l.end()) == ref.complete());
        ++total_steps;
      }
      // After the step: the published set, references and evictions must agree too.
      REQUIRE(kv.free_blocks() == ref.free_blocks());
      REQUIRE(kv.reserved_remaining() == ref.outstanding());
      REQUIRE(kv.cached_blocks() == ref.cached_blocks());
      REQUIRE(kv.evictions() == ref.counters().evictions);
      std::vector<int> ref_published;
      for (int blk = 0; blk < c.cfg.num_blocks; ++blk)
        if (ref.is_published(blk)) ref_published.push_back(blk);
      REQUIRE(published_blocks(kv) == ref_published);
      require_same_requests(a, b, kv, ref);
      bool all_gone = step > 60;
      for (const Request& r : a) all_gone = all_gone && !r.alive();
      if (all_gone) break;
    }
    for (const Request& r : a) REQUIRE_FALSE(r.alive());
    // Nothing leaked: no block referenced, nothing reserved; cached blocks stay, unreferenced.
    CHECK(kv.used_blocks() == 0);
    CHECK(kv.free_blocks() == kv.num_blocks());
    CHECK(kv.reserved_remaining() == 0);
    CHECK(ref.referenced_blocks() == 0);
    CHECK(ref.outstanding() == 0);
    for (const Request& r : a) {
      admissions += r.first_scheduled != kNever;
      cached_tokens += r.num_cached_tokens;
      CHECK(r.num_cached_tokens % c.cfg.block_size == 0);
      CHECK(r.num_cached_tokens < std::max(r.prompt_len, 1));
      if (!c.cfg.prefix_caching) CHECK(r.num_cached_tokens == 0);
    }
    evictions += kv.evictions();
    const RefCounters& k = ref.counters();
    total.hit_blocks += k.hit_blocks;
    total.hit_free_blocks += k.hit_free_blocks;
    total.hit_admissions += k.hit_admissions;
    total.capped_hits += k.capped_hits;
    total.published += k.published;
    total.duplicate_publishes += k.duplicate_publishes;
    total.refused_for_free_hits += k.refused_for_free_hits;
  }
  MESSAGE("prefix caching: ", cases_on, " cases on, ", cases_off, " off; compared ", total_steps, " steps; ",
          admissions, " admissions, ", total.hit_admissions, " with a hit (", total.capped_hits,
          " stopped by the prompt_len - 1 cap); ", total.hit_blocks, " hit blocks (", total.hit_free_blocks,
          " taken off the free list), ", cached_tokens, " cached tokens; ", total.published, " blocks published, ",
          total.duplicate_publishes, " duplicates not; ", evictions, " evictions; ", total.refused_for_free_hits,
          " admissions refused for their free hit blocks; ", mid_prompt_cancels, " cancels mid-prompt, ",
          in_flight_cancels, " in flight");
  CHECK(total_steps > 20000);
  CHECK(total.hit_admissions > 1000);
  CHECK(total.hit_free_blocks > 1000);
  CHECK(total.capped_hits > 100);
  CHECK(total.duplicate_publishes > 100);
  CHECK(evictions > 1000);
  CHECK(total.refused_for_free_hits > 20);
  CHECK(mid_prompt_cancels > 20);
  CHECK(in_flight_cancels > 20);
}
