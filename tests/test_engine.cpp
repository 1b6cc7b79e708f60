// The engine: event order, determinism, and run-wide properties on random workloads.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "backend/cost_model.h"
#include "core/rng.h"
#include "sim/engine/engine.h"
#include "sim/engine/events.h"
#include "sim/run/executors.h"
#include "sim/outputs/outputs.h"
#include "sim/run/run_setup.h"
#include "tests/test_helpers.h"

using namespace tandem;

namespace {
struct Run {
  Workload w;
  std::unique_ptr<SimExecutor> exec;
  VirtualClock clock;
  std::unique_ptr<Engine> engine;
  explicit Run(const std::string& yaml, std::vector<Override> o = {}) : w(parse_workload(yaml, "w.yaml", o)) {
    exec = std::make_unique<SimExecutor>(std::make_unique<AnalyticalCostModel>(w.model, w.hardware));
    engine = std::make_unique<Engine>(w, generate_requests(w), *exec, clock);
  }
};

struct InvariantChecker : run_observer_i {
  int64_t steps = 0, done = 0;
  Time last_start = -1;
  void on_step(const StepRecord& r) override {
    ++steps;
    REQUIRE(r.kv_used + r.kv_reserved <= r.kv_capacity);  // held + reserved never exceed the cache
    REQUIRE(r.start >= last_start);
    REQUIRE(r.plan->num_tokens > 0);
    last_start = r.start;
  }
  void on_request_done(const Request& r) override {
    ++done;
    REQUIRE_FALSE(r.alive());
  }
};

std::string random_workload(uint64_t seed) {
  Rng rng(seed);
  const char* arrivals[] = {"{process: poisson, rate: 30}", "{process: gamma, rate: 20, cv: 4}", "{process: burst}",
                            "{process: constant, rate: 50}"};
  return fmt::format(R"(seed: {}
model: {{layers: 4, hidden: 512, heads: 8, kv_heads: 2, ffn: 1024, vocab: 1000, max_model_len: {}}}
hardware: {{peak_tflops: {}, mem_bandwidth_tbs: {}, step_overhead_us: 50, memory_gb: 10}}
engine: {{policy: {}, max_num_seqs: {}, max_num_batched_tokens: {}, block_size: {}, num_kv_blocks: {}{}, enable_chunked_prefill: {}, max_num_partial_prefills: {}}}
requests:
  count: {}
  arrival: {}
  prompt_len: {{dist: lognormal, median: {}, sigma: 1, min: 1, max: 3000}}
  output_len: {{dist: uniform, min: 1, max: {}}}
  cancel: {{fraction: {}, after_s: {{dist: uniform, min: 0, max: 0.5}}}}
)",
                     seed, rng.uniform_int(200, 4000), rng.uniform() < 0.5 ? 100.0 : 0.1,
                     rng.uniform() < 0.5 ? 1.0 : 0.01,  // slow: prompts take long
                     rng.uniform() < 0.3 ? "static" : "continuous", rng.uniform_int(1, 64), rng.uniform_int(64, 4096),
                     rng.uniform() < 0.5 ? 16 : 1 + rng.uniform_int(0, 31), rng.uniform_int(8, 3000),
                     rng.uniform() < 0.2 ? fmt::format(", state_slots: {}", rng.uniform_int(0, 8)) : "",
                     rng.uniform() < 0.6 ? "true" : "false", rng.uniform_int(1, 3), rng.uniform_int(1, 400),
                     arrivals[rng.uniform_int(0, 3)], rng.uniform_int(10, 800), rng.uniform_int(1, 300),
                     rng.uniform() * 0.3);
}

// Stage 3: shared-prefix groups (a leading part of the drawn prompt, or a system prompt put
// before it), caching on, caches a few lifetimes small so that cached blocks are evicted.
std::string random_prefix_workload(uint64_t seed) {
  Rng rng(seed);
  const int64_t block = std::vector<int64_t>{4, 8, 16, 32}[size_t(rng.uniform_int(0, 3))];
  const int64_t prefix_max = rng.uniform_int(16, 1500), median = rng.uniform_int(10, 400),
                out_max = rng.uniform_int(1, 200);
  const int64_t typical_blocks = (prefix_max + median + out_max) / block + 1;
  const char* arrivals[] = {"{process: poisson, rate: 40}", "{process: gamma, rate: 20, cv: 4}", "{process: burst}",
                            "{process: constant, rate: 80}"};
  return fmt::format(R"(seed: {}
model: {{layers: 4, hidden: 512, heads: 8, kv_heads: 2, ffn: 1024, vocab: 1000, max_model_len: {}}}
hardware: {{peak_tflops: {}, mem_bandwidth_tbs: {}, step_overhead_us: 50, memory_gb: 10}}
engine: {{policy: {}, max_num_seqs: {}, max_num_batched_tokens: {}, block_size: {}, num_kv_blocks: {}{}, enable_chunked_prefill: {}, max_num_partial_prefills: {}, enable_prefix_caching: true}}
requests:
  count: {}
  arrival: {}
  prompt_len: {{dist: lognormal, median: {}, sigma: 1, min: 1, max: 2000}}
  output_len: {{dist: uniform, min: 1, max: {}}}
  shared_prefix: {{groups: {}, prefix_len: {{dist: uniform, min: 1, max: {}}}, fraction: {}, prepend: {}}}
  cancel: {{fraction: {}, after_s: {{dist: uniform, min: 0, max: 0.5}}}}
)",
                     seed, rng.uniform_int(500, 6000), rng.uniform() < 0.5 ? 100.0 : 0.1,
                     rng.uniform() < 0.5 ? 1.0 : 0.01, rng.uniform() < 0.2 ? "static" : "continuous",
                     rng.uniform_int(1, 48), rng.uniform_int(block, 2048), block,
                     rng.uniform_int(typical_blocks, 6 * typical_blocks),
                     // No state slots here: prefix caching is refused with them (the draw keeps the stream).
                     rng.uniform() < 0.1 ? (rng.uniform_int(1, 8), "") : "", rng.uniform() < 0.7 ? "true" : "false",
                     rng.uniform_int(1, 3), rng.uniform_int(20, 250), arrivals[rng.uniform_int(0, 3)], median, out_max,
                     rng.uniform_int(1, 6), prefix_max, 0.5 + 0.5 * rng.uniform(),
                     rng.uniform() < 0.5 ? "true" : "false", rng.uniform() * 0.3);
}
}  // namespace

TEST_CASE("events pop by time, then by posting order") {
  EventQueue q;
  q.post(5, Arrival{1});
  q.post(3, Cancel{2});
  q.post(5, StepDone{0});
  q.post(3, Arrival{3});
  std::vector<std::pair<Time, size_t>> got;
  while (!q.empty()) {
    auto e = q.pop();
    got.push_back({e.time, e.event.index()});
  }
  CHECK(got == std::vector<std::pair<Time, size_t>>{{3, 2}, {3, 0}, {5, 0}, {5, 1}});  // Cancel is index 2
}

TEST_CASE("virtual clock never goes back, and yields to a non-empty inbox") {
  VirtualClock c;
  Inbox inbox;
  CHECK(c.wait_until(10, inbox));
  CHECK(c.wait_until(5, inbox));
  CHECK(c.now() == 10);
  inbox.post(Cancel{3});
  CHECK_FALSE(c.wait_until(20, inbox));  // take the post in first
  CHECK(c.now() == 10);
  std::vector<Event> got;
  CHECK(inbox.drain([&](Event&& e) { got.push_back(e); }) == 1);
  REQUIRE(got.size() == 1);
  CHECK(std::get<Cancel>(got[0]).id == 3);
  CHECK(inbox.empty());
  CHECK(c.wait_until(20, inbox));
  CHECK(c.now() == 20);
}

TEST_CASE("wall clock: a post from another thread cuts a wait for a far event short") {
  WallClock c;
  Inbox inbox;
  const Time far = c.now() + from_seconds(30);
  const auto t0 = std::chrono::steady_clock::now();
  std::thread poster([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    inbox.post(StepDone{0});
  });
  const bool reached = c.wait_until(far, inbox);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  poster.join();
  CHECK_FALSE(reached);
  CHECK(waited >= 0.015);  // it did wait for the post, not return at once
  CHECK(waited < 5.0);     // the bound: far below the 30 s the event is due at
  int n = 0;
  inbox.drain([&](Event&& e) { n += std::holds_alternative<StepDone>(e); });
  CHECK(n == 1);
  // With nothing posted, a wait for a near time returns when that time comes.
  CHECK(c.wait_until(c.now() + from_seconds(0.01), inbox));
}

TEST_CASE("the engine takes in what other threads posted: a cancel through the inbox ends a running request") {
  const std::string y = R"(model: llama3-8b
hardware: h200
requests: {count: 2, arrival: {process: burst}, prompt_len: 100, output_len: 1000}
)";
  Workload w = parse_workload(y, "inbox.yaml");
  VirtualClock clock;
  SimExecutor exec(make_cost_model(w.model, w.hardware, w.engine.tp));
  Engine e(w, generate_requests(w), exec, clock);
  e.inbox().post(Cancel{1});  // taken in at time 0, before any event
  const Summary s = e.run();
  CHECK(s.cancelled == 1);
  CHECK(s.finished == 1);
  CHECK(e.requests()[1].status == RequestStatus::Cancelled);
  CHECK(e.requests()[1].generated == 0);
}

// tandem serve's open run: requests as Submit events into empty slots, prompts from the client,
// the end after a Close; the table is cut to the slots used.
TEST_CASE("an open run: Submit fills slots, Cancel and Close through the inbox, only used slots are outputs") {
  const std::string y = R"(model: llama3-8b
hardware: h200
engine: {enable_prefix_caching: true}
requests: {count: 1, arrival: {process: burst}, prompt_len: 1, output_len: 1}
)";
  Workload w = parse_workload(y, "open.yaml");
  VirtualClock clock;
  SimExecutor exec(make_cost_model(w.model, w.hardware, w.engine.tp));
  RequestSet slots;
  slots.requests.resize(5);
  for (size_t i = 0; i < slots.requests.size(); ++i) {
    slots.requests[i].id = ReqId(i);
    slots.requests[i].arrival = kNever;
  }
  struct Prompts : client_prompts_i {
    std::vector<std::vector<Token>> p{std::vector<Token>(40, 7), std::vector<Token>(40, 7), std::vector<Token>(20, 3)};
    std::span<const Token> prompt(ReqId id) const override { return p[size_t(id)]; }
  } prompts;
  struct Tokens : run_observer_i {
    std::map<ReqId, int> tokens;
    int done = 0;
    void on_token(const Request& r, Time) override { ++tokens[r.id]; }
    void on_request_done(const Request&) override { ++done; }
  } seen;
  Engine e(w, std::move(slots), exec, clock);
  e.open_arrivals(&prompts);
  e.add_observer(&seen);
  e.inbox().post(Submit{0, 40, 5});
  e.inbox().post(Submit{1, 40, 3});
  e.inbox().post(Submit{2, 20, 1000});
  e.inbox().post(Cancel{2});
  e.inbox().post(Close{});
  const Summary s = e.run();
  REQUIRE(e.requests().size() == 3);  // slots 3 and 4 were never used: not part of the run
  CHECK(s.finished == 2);
  CHECK(s.cancelled == 1);
  CHECK(seen.tokens[0] == 5);
  CHECK(seen.tokens[1] == 3);
  CHECK(seen.tokens.count(2) == 0);
  CHECK(seen.done == 3);
  CHECK(e.requests()[0].prompt_len == 40);
}

// tandem serve's table starts empty and grows as clients come (doubling), while earlier requests
// are waiting, running, parked or moving between instances: the schedulers, KV caches, handoff
// and topology must follow the moved table. Each wave is submitted from inside a step, so the
// table grows with requests in every phase; every 7th request is cancelled a step later.
TEST_CASE("an open run grows its request table from empty while requests are in flight (2 replicas, 1P1D)") {
  for (const std::string layout :
       {"engine: {enable_prefix_caching: true, data_parallel: 2, max_num_seqs: 64}\n",
        "engine: {max_num_seqs: 64}\ndisaggregation: {enabled: true, decode: {max_num_seqs: 8}}\n"}) {
    CAPTURE(layout);
    const std::string y = "model: llama3-8b\nhardware: h200\n" + layout +
                          "requests: {count: 1, arrival: {process: burst}, prompt_len: 1, output_len: 1}\n";
    Workload w = parse_workload(y, "grow.yaml");
    VirtualClock clock;
    SimExecutor exec(make_cost_model(w.model, w.hardware, w.engine.tp));
    Engine e(w, RequestSet{}, exec, clock);
    struct Prompts : client_prompts_i {
      std::vector<Token> p = std::vector<Token>(64, 5);  // one prompt for all: prefix hits on replay
      std::span<const Token> prompt(ReqId) const override { return p; }
    } prompts;
    struct Feeder : run_observer_i {
      Engine& e;
      explicit Feeder(Engine& en) : e(en) {}
      const int kTotal = 700, kWave = 50;
      int submitted = 0, done = 0;
      std::vector<ReqId> to_cancel;
      std::set<size_t> table_sizes;  // the table's size (used and empty slots) seen at each step
      std::map<ReqId, int> tokens;
      void submit_wave() {
        for (ReqId id : to_cancel) e.inbox().post(Cancel{id});
        to_cancel.clear();
        for (int k = 0; k < kWave && submitted < kTotal; ++k, ++submitted) {
          e.inbox().post(Submit{submitted, 64, 20});
          if (submitted % 7 == 3) to_cancel.push_back(submitted);
        }
        if (submitted == kTotal && to_cancel.empty()) e.inbox().post(Close{});
      }
      void on_step(const StepRecord&) override {
        table_sizes.insert(e.requests().size());
        if (submitted < kTotal || !to_cancel.empty()) submit_wave();
      }
      void on_token(const Request& r, Time) override { ++tokens[r.id]; }
      void on_request_done(const Request&) override { ++done; }
    } feeder(e);
    e.open_arrivals(&prompts);
    e.add_observer(&feeder);
    feeder.submit_wave();
    Summary s;
    REQUIRE_NOTHROW(s = e.run());  // the end-of-run checks: nothing lost, no KV held or reserved
    REQUIRE(e.requests().size() == size_t(feeder.kTotal));
    CHECK(feeder.done == feeder.kTotal);
    CHECK(s.cancelled == 100);  // ids 3, 10, ..., 696
    CHECK(s.finished == feeder.kTotal - 100);
    for (const Request& r : e.requests())
      if (r.status == RequestStatus::Finished) CHECK(feeder.tokens[r.id] == 20);
    // The table grew while the run went on (64 slots first, doubling to 1,024): at least 4 of
    // those sizes were seen from inside steps (two replicas' steps may both submit a wave first).
    CHECK(feeder.table_sizes.size() >= 4);
    CHECK(*feeder.table_sizes.begin() == 64);
    CHECK(*feeder.table_sizes.rbegin() == 1024);
    MESSAGE(layout, ": table sizes seen ", feeder.table_sizes.size(), ", finished ", s.finished, ", cancelled ",
            s.cancelled, ", transfers delivered ", s.disaggregation.delivered);
    if (w.disaggregation.enabled) CHECK(s.disaggregation.delivered > 500);
  }
}

TEST_CASE(
    "property: 300 random workloads, chunked and not, held + reserved <= capacity at every step, no request lost") {
  int64_t total_steps = 0, finished = 0, failed = 0, cancelled = 0, chunked_runs = 0, cancelled_mid_prompt = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    const std::string y = random_workload(seed);
    INFO(y);
    Run run(y);
    InvariantChecker chk;
    run.engine->add_observer(&chk);
    Summary s;
    REQUIRE_NOTHROW(s = run.engine->run());  // throws if any request is still alive at the end
    CHECK(s.finished + s.failed + s.cancelled == s.total);
    CHECK(chk.done == s.total);
    total_steps += chk.steps;
    finished += s.finished;
    failed += s.failed;
    cancelled += s.cancelled;
    const bool chunked = run.w.engine.enable_chunked_prefill;
    chunked_runs += chunked;
    for (const Request& r : run.engine->requests()) {
      if (r.status == RequestStatus::Finished) CHECK(r.generated == r.max_output);
      if (r.status == RequestStatus::Failed) CHECK(r.fail_reason != FailReason::None);
      if (chunked) CHECK(r.fail_reason != FailReason::PromptOverBudget);  // chunking serves any prompt
      // A cancelled request that was scheduled but never sampled was cut mid-prompt.
      cancelled_mid_prompt += r.status == RequestStatus::Cancelled && r.first_scheduled != kNever && r.generated == 0;
    }
  }
  MESSAGE(total_steps, " steps; finished ", finished, ", failed ", failed, ", cancelled ", cancelled, " (",
          cancelled_mid_prompt, " in the middle of their prompt); ", chunked_runs, " runs chunked");
  CHECK(chunked_runs > 100);
  CHECK(cancelled_mid_prompt > 0);
  CHECK(finished > 0);
  CHECK(failed > 0);
  CHECK(cancelled > 0);
}

TEST_CASE(
    "property: 300 random shared-prefix workloads with prefix caching, small caches, cancellations: invariants hold, "
    "no leak") {
  int64_t total_steps = 0, finished = 0, failed = 0, cancelled = 0, cancelled_mid_prompt = 0, hit_tokens = 0,
          hit_requests = 0;
  int64_t evictions = 0, runs_with_evictions = 0, prepend_runs = 0, cancelled_with_hit = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    const std::string y = random_prefix_workload(seed);
    INFO(y);
    Run run(y);
    REQUIRE(run.w.engine.enable_prefix_caching);
    InvariantChecker chk;
    run.engine->add_observer(&chk);
    Summary s;
    // Throws if a request is still alive at the end, or if a block is still referenced or
    // reserved once all requests are gone (the leak check).
    REQUIRE_NOTHROW(s = run.engine->run());
    CHECK(s.finished + s.failed + s.cancelled == s.total);
    CHECK(chk.done == s.total);
    const int32_t bs = run.w.engine.block_size;
    int64_t run_hit_tokens = 0;
    for (const Request& r : run.engine->requests()) {
      if (r.status == RequestStatus::Finished) CHECK(r.generated == r.max_output);
      if (r.status == RequestStatus::Failed) CHECK(r.fail_reason != FailReason::None);
      // A hit is whole blocks, never the whole prompt, and only within the shared prefix: a
      // block of >= 4 of a request's own random tokens does not collide by chance, but the
      // block that straddles the prefix's end may (its own tokens there can be as few as one).
      CHECK(r.num_cached_tokens % bs == 0);
      CHECK(r.num_cached_tokens <= std::max(0, r.prompt_len - 1));
      CHECK(r.num_cached_tokens <= (r.prefix_group >= 0 ? (r.prefix_len + bs - 1) / bs * bs : 0));
      if (r.num_cached_tokens > 0) CHECK(r.first_scheduled != kNever);
      run_hit_tokens += r.num_cached_tokens;
      hit_requests += r.num_cached_tokens > 0;
      cancelled_mid_prompt += r.status == RequestStatus::Cancelled && r.first_scheduled != kNever && r.generated == 0;
      cancelled_with_hit += r.status == RequestStatus::Cancelled && r.num_cached_tokens > 0;
    }
    CHECK(s.prefix_hit_tokens == run_hit_tokens);
    total_steps += chk.steps;
    finished += s.finished;
    failed += s.failed;
    cancelled += s.cancelled;
    hit_tokens += s.prefix_hit_tokens;
    evictions += s.prefix_evictions;
    runs_with_evictions += s.prefix_evictions > 0;
    prepend_runs += run.w.requests.shared_prefix.prepend;
  }
  MESSAGE(total_steps, " steps; finished ", finished, ", failed ", failed, ", cancelled ", cancelled, " (",
          cancelled_mid_prompt, " mid-prompt, ", cancelled_with_hit, " after a hit); ", hit_requests, " requests hit, ",
          hit_tokens, " hit tokens; ", evictions, " evictions in ", runs_with_evictions, " runs; ", prepend_runs,
          " runs with prepended prefixes");
  CHECK(hit_requests > 1000);
  CHECK(runs_with_evictions > 60);
  CHECK(cancelled_mid_prompt > 0);
  CHECK(cancelled_with_hit > 0);
  CHECK(finished > 0);
  CHECK(prepend_runs > 60);
  CHECK(prepend_runs < 240);
}

// Extreme knobs (issue "Hardening after stage 3"): block size 1 and 2, caches that hold one
// request or less, budgets below a block (chunking off), lengths up to 2^31 - 1, thousands of
// requests on a few blocks, shared prefixes and cancellations. Every run ends with every
// request finished, failed with a reason or cancelled, invariants held at every step.
TEST_CASE("property: 200 workloads with extreme knobs end cleanly, every request accounted for") {
  int64_t runs = 0, steps = 0, finished = 0, failed = 0, cancelled = 0, evictions = 0;
  std::map<std::string, int64_t> reasons;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    Rng rng(seed * 104729);
    const int64_t block = rng.uniform() < 0.5 ? 1 : 2;
    const bool chunked = rng.uniform() < 0.5;
    const int64_t budget = chunked ? rng.uniform_int(block, 8) : rng.uniform_int(1, 3);  // below a block of 4+ when off
    const int64_t blocks = rng.uniform_int(2, 40);  // 2 tokens (the least lifetime) fit: else refused at parse
    const int64_t count = rng.uniform() < 0.2 ? 3000 : rng.uniform_int(1, 80);
    const std::string y = fmt::format(R"(seed: {}
model: {{preset: tiny, max_model_len: 2147483647}}
hardware: h200
engine: {{block_size: {}, num_kv_blocks: {}, max_num_batched_tokens: {}, enable_chunked_prefill: {}, max_num_seqs: {}}}
requests:
  count: {}
  arrival: {{process: poisson, rate: {}}}
  prompt_len: {{dist: mixture, components: [{{weight: 8, dist: uniform, min: 1, max: 24}}, {{weight: 1, dist: fixed, value: 2147483647}}]}}
  output_len: {{dist: mixture, components: [{{weight: 8, dist: uniform, min: 1, max: 12}}, {{weight: 1, dist: fixed, value: 2000000000}}]}}
  shared_prefix: {{groups: 2, prefix_len: {{dist: uniform, min: 1, max: 16}}, fraction: 0.5}}
  cancel: {{fraction: 0.2, after_s: {{dist: uniform, min: 0, max: 0.01}}}}
)",
                                      seed, block, blocks, budget, chunked ? "true" : "false", rng.uniform_int(1, 8),
                                      count, rng.uniform() < 0.5 ? 10000 : 100);
    INFO(y);
    Run run(y);
    InvariantChecker chk;
    run.engine->add_observer(&chk);
    Summary s;
    REQUIRE_NOTHROW(s = run.engine->run());
    CHECK(s.finished + s.failed + s.cancelled == s.total);
    CHECK(chk.done == s.total);
    for (const Request& r : run.engine->requests())
      if (r.status == RequestStatus::Failed) ++reasons[std::string(to_string(r.fail_reason))];
    ++runs;
    steps += chk.steps;
    finished += s.finished;
    failed += s.failed;
    cancelled += s.cancelled;
    evictions += s.prefix_evictions;
  }
  std::string by_reason;
  for (const auto& [why, n] : reasons) by_reason += fmt::format(" {} {}", why, n);
  MESSAGE(runs, " runs, ", steps, " steps; finished ", finished, ", cancelled ", cancelled, ", failed ", failed, ":",
          by_reason, "; ", evictions, " evictions");
  // The extremes were reached: huge lengths and caches too small failed at arrival, tiny
  // budgets failed prompts with chunking off, and small caches evicted.
  CHECK(reasons["exceeds_max_model_len"] + reasons["exceeds_kv_capacity"] > 0);
  CHECK(reasons["exceeds_kv_capacity"] > 0);
  CHECK(reasons["prompt_over_token_budget"] > 0);
  CHECK(finished > 0);
  CHECK(cancelled > 0);
  CHECK(evictions > 0);
}

TEST_CASE("the same seed gives byte-identical outputs") {
  namespace fs = std::filesystem;
  const std::string y = random_workload(77);
  const fs::path base = fs::temp_directory_path() / fmt::format("tandem_det_{}", ::getpid());
  for (int i = 0; i < 2; ++i) {
    Run run(y);
    RunOutputs out((base / std::to_string(i)).string());
    run.engine->add_observer(&out);
    Summary s = run.engine->run();
    out.finish(*run.engine, s, run.w);
  }
  for (const char* f : {"requests.csv", "steps.csv", "trace.json", "workload.resolved.yaml"}) {
    const std::string a = tandem::testing::read_file((base / "0" / f).string());
    CHECK(a.size() > 100);
    CHECK(a == tandem::testing::read_file((base / "1" / f).string()));
  }
  // summary.json differs only in wall time and memory, which are measurements.
  auto strip = [](std::string s) {
    auto j = nlohmann::json::parse(s);
    j.erase("wall_s");
    j.erase("peak_rss_mb");
    return j.dump();
  };
  CHECK(strip(tandem::testing::read_file((base / "0/summary.json").string())) ==
        strip(tandem::testing::read_file((base / "1/summary.json").string())));
  fs::remove_all(base);
}

TEST_CASE("a lone request: TTFT is its prefill step, TPOT its decode steps") {
  Run run(R"(model: llama3-8b
hardware: {preset: h200, step_overhead_us: 100}
requests: {count: 1, arrival: {process: burst}, prompt_len: 1000, output_len: 11}
)");
  Summary s = run.engine->run();
  const Request& r = run.engine->requests()[0];
  StepPlan prefill;
  prefill.add({0, 1000, 0, true, {}}, 1000);
  AnalyticalCostModel m(run.w.model, run.w.hardware);
  CHECK(r.first_token == from_seconds(m.estimate(prefill).total_s()));
  CHECK(s.steps == 11);
  CHECK(s.tpot_ms.n == 1);
  // Decode of one sequence is memory-bound: about the weights over bandwidth plus overhead.
  const double weights_s = (run.w.model.linear_params() + 4096.0 * 128256) * 2 / 4.3e12;
  CHECK(s.tpot_ms.mean == doctest::Approx((weights_s + 100e-6) * 1e3).epsilon(0.01));
}

TEST_CASE("cancellations: before arrival, while waiting, while running") {
  Run run(R"(model: llama3-8b
hardware: h200
engine: {max_num_seqs: 1}
requests:
  count: 3
  arrival: {process: burst}
  prompt_len: 100
  output_len: 1000
  cancel: {at: [{request: 0, at_s: 0.5}, {request: 2, at_s: 0.1}]}
)");
  Summary s = run.engine->run();
  const auto& r = run.engine->requests();
  CHECK(r[0].status == RequestStatus::Cancelled);  // running when cancelled
  CHECK(r[0].generated > 10);
  CHECK(r[0].finish >= from_seconds(0.5));
  CHECK(r[1].status == RequestStatus::Finished);
  CHECK(r[2].status == RequestStatus::Cancelled);  // cancelled while waiting for the seat
  CHECK(r[2].generated == 0);
  CHECK(s.cancelled == 2);
  CHECK(s.finished == 1);
}

TEST_CASE("1P1D: a cancel placed at each phase of the handoff ends the request there; both pools end empty") {
  Run run(R"(model: llama3-8b
hardware: h200
engine: {max_num_seqs: 8}
requests:
  count: 12
  arrival: {process: burst}
  prompt_len: 200
  output_len: 20
  cancel:
    at: [{request: 1, phase: prefill}, {request: 2, phase: parked}, {request: 3, phase: transfer},
         {request: 4, phase: received}, {request: 5, phase: decode}, {request: 11, phase: parked}]
disaggregation: {enabled: true, decode: {max_num_seqs: 2}}
)");
  Summary s = run.engine->run();  // its end-of-run check: no block held or reserved on either instance
  const auto& r = run.engine->requests();
  for (int i : {1, 2, 3, 4, 5, 11}) {
    CAPTURE(i);
    CHECK(r[size_t(i)].status == RequestStatus::Cancelled);
  }
  CHECK(r[1].generated <= 1);              // its prompt was running on P (the step in flight may still sample)
  CHECK(r[1].finish == r[0].first_token);  // it left when that step ended
  CHECK(r[2].generated == 1);              // the first token came from P
  CHECK(r[3].generated == 1);
  CHECK(r[4].generated == 1);   // on D, before D stepped it
  CHECK(r[5].generated == 2);   // after its first step on D
  CHECK(r[11].generated == 1);  // parked behind D's two seats
  const DisaggregationFigures& d = s.disaggregation;
  CHECK(d.cancelled_prefill == 1);
  CHECK(d.cancelled_parked == 2);
  CHECK(d.cancelled_transfer == 1);
  CHECK(d.cancelled_received == 1);
  CHECK(d.cancelled_decode == 1);
  CHECK(d.started == 12 - 3);
  CHECK(d.aborted == 1);  // the sim channel stops at once: a synchronous abort
  CHECK(d.delivered == 8);
  CHECK(s.finished == 6);
  CHECK(s.cancelled == 6);
}

TEST_CASE("a cancel at a phase needs disaggregation; an unknown phase is named") {
  const std::string base =
      "model: tiny\nhardware: h200\nrequests: {count: 2, arrival: {process: burst}, prompt_len: 4, "
      "output_len: 2, cancel: {at: [{request: 1, ";
  CHECK_THROWS_WITH_AS(parse_workload(base + "phase: parked}]}}\n", "w.yaml"),
                       doctest::Contains("a cancel at a phase (prefill, parked, transfer, received, decode) needs "
                                         "disaggregation.enabled: true"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_workload(base + "phase: sending}]}}\ndisaggregation: {enabled: true}\n", "w.yaml"),
                       doctest::Contains("field 'requests.cancel.at[0].phase': unknown phase 'sending'"), InputError);
  CHECK_THROWS_WITH_AS(parse_workload(base + "phase: parked, at_s: 1}]}}\ndisaggregation: {enabled: true}\n", "w.yaml"),
                       doctest::Contains("give at_s (a time) or phase"), InputError);
  // The resolved workload prints it back.
  const Workload w = parse_workload(base + "phase: received}]}}\ndisaggregation: {enabled: true}\n", "w.yaml");
  REQUIRE(w.requests.cancel.phase_cancels.size() == 1);
  CHECK(w.requests.cancel.phase_cancels[0].phase == "received");
  CHECK(to_yaml(w).find("phase: received") != std::string::npos);
}

TEST_CASE("continuous batching beats static on a mixed long/short workload") {
  const std::string y = tandem::testing::read_file(tandem::testing::source_path("workloads/mixed_long_short.yaml"));
  Run cont(y, {{"requests.count", "400"}}), stat(y, {{"requests.count", "400"}, {"engine.policy", "static"}});
  const Summary a = cont.engine->run(), b = stat.engine->run();
  CHECK(a.finished == 400);
  CHECK(b.finished == 400);
  CHECK(a.requests_per_s > 1.5 * b.requests_per_s);
  CHECK(a.ttft_ms.p50 < b.ttft_ms.p50);
}

TEST_CASE("stage 4: an instance's own hardware prices its steps: a slower decode card slows decode, not prefill") {
  const std::string pd = R"(seed: 5
model: llama3-8b
hardware: h200
requests:
  count: 40
  arrival: {process: poisson, rate: 20}
  prompt_len: {dist: uniform, min: 200, max: 2000}
  output_len: {dist: uniform, min: 20, max: 200}
disaggregation: {enabled: true, channel: {kind: sim}}
)";
  struct Steps : run_observer_i {
    std::vector<std::vector<std::pair<Time, Duration>>> by_instance{2};
    void on_step(const StepRecord& r) override { by_instance[size_t(r.instance)].push_back({r.start, r.elapsed}); }
  };
  const auto run = [&](const std::vector<Override>& o, Steps& steps) {
    RunSetup run(parse_workload(pd, "w.yaml", o), {.backend = "sim"});
    Engine& e = run.start(generate_requests(run.workload));
    e.add_observer(&steps);
    return e.run();
  };
  Steps a, b;
  const Summary sa = run({}, a);
  // The decode card's memory bandwidth 4.3 -> 1 TB/s: decode steps stream the weights, so they take longer.
  const Summary sb = run({{"disaggregation.decode.hardware.mem_bandwidth_tbs", "1"}}, b);
  REQUIRE(sa.finished == 40);
  REQUIRE(sb.finished == 40);
  REQUIRE(a.by_instance[0].size() > 0);
  REQUIRE(a.by_instance[1].size() > 0);
  CHECK(a.by_instance[0] == b.by_instance[0]);  // prefill: the same steps at the same times, each as long
  const auto mean = [](const std::vector<std::pair<Time, Duration>>& s) {
    double t = 0;
    for (const auto& [start, elapsed] : s) t += double(elapsed);
    return t / double(s.size());
  };
  MESSAGE("decode step mean ", mean(a.by_instance[1]) / 1e6, " ms on h200, ", mean(b.by_instance[1]) / 1e6,
          " ms at 1 TB/s; TPOT p50 ", sa.tpot_ms.p50, " -> ", sb.tpot_ms.p50, " ms");
  CHECK(mean(b.by_instance[1]) > 2.5 * mean(a.by_instance[1]));
  CHECK(sb.tpot_ms.p50 > 2.5 * sa.tpot_ms.p50);
  CHECK(sb.ttft_ms.p50 == sa.ttft_ms.p50);  // the first token comes from the prefill instance
}

// A two-matrix MLP (GELU, ReLU) against SwiGLU, priced by hand on a small shape: layers 2, hidden
// 64, heads 4 (head dim 16), KV heads 2, ffn 256, vocab 1000, fp16.
//   attention per layer: q 64x64 + k, v 2 x 64x32 + o 64x64 = 12,288
//   MLP per layer: SwiGLU 3 x 64x256 = 49,152; GELU 2 x 64x256 = 32,768
//   linear: SwiGLU 2 x (12,288 + 49,152) = 122,880; GELU 2 x (12,288 + 32,768) = 90,112
TEST_CASE("the cost model prices a two-matrix GELU MLP and SwiGLU by hand: FLOPs and bytes per token") {
  ModelSpec swiglu;
  swiglu.name = "hand";
  swiglu.layers = 2;
  swiglu.hidden = 64;
  swiglu.heads = 4;
  swiglu.kv_heads = 2;
  swiglu.ffn = 256;
  swiglu.vocab = 1000;
  swiglu.dtype = "fp16";
  swiglu.max_model_len = 512;
  ModelSpec gelu = swiglu;
  gelu.mlp = "gelu";
  CHECK(swiglu.linear_params() == 122880);
  CHECK(gelu.linear_params() == 90112);
  // Embedding and LM head: untied 2 x 64 x 1000; tied once; learned positions add 512 x 64.
  CHECK(gelu.embedding_params() == 128000);
  ModelSpec opt_like = gelu;
  opt_like.mlp = "relu";
  opt_like.tie_embeddings = true;
  opt_like.positions = "learned";
  CHECK(opt_like.embedding_params() == 64000 + 512 * 64);
  CHECK_FALSE(opt_like.llama_decoder());
  CHECK(swiglu.llama_decoder());

  // A 1,000-token prompt on 1 TFLOP/s and 1 TB/s: compute-bound. GEMM FLOPs = 2 x linear x
  // tokens + 2 x hidden x vocab for the one sampled row.
  HardwareSpec hw;
  hw.name = "hand";
  hw.peak_flops = 1e12;
  hw.mem_bandwidth = 1e12;
  StepPlan prompt;
  prompt.add({0, 1000, 0, true, {}}, 1000);
  const StepCost p_swiglu = AnalyticalCostModel(swiglu, hw).estimate(prompt);
  const StepCost p_gelu = AnalyticalCostModel(gelu, hw).estimate(prompt);
  CHECK(p_swiglu.gemm_s == doctest::Approx((2.0 * 122880 * 1000 + 2.0 * 64 * 1000) / 1e12).epsilon(1e-12));
  CHECK(p_gelu.gemm_s == doctest::Approx((2.0 * 90112 * 1000 + 2.0 * 64 * 1000) / 1e12).epsilon(1e-12));
  CHECK(AnalyticalCostModel(opt_like, hw).estimate(prompt).gemm_s == p_gelu.gemm_s);  // relu prices as gelu
  // The MLP does not touch attention.
  CHECK(p_gelu.attention_s == p_swiglu.attention_s);

  // One decode on 1 GB/s: memory-bound. Bytes = (linear + LM head 64 x 1000) x 2 + activations
  // 2 layers x (4 x 64 + (matrices - 1) x 256) x 2 bytes: SwiGLU 2 x 768 x 2 = 3,072 (x2 for in
  // and out) ... as the model counts them: 2 x layers x (4h + (m - 1) ffn) x bytes per token.
  hw.mem_bandwidth = 1e9;
  StepPlan decode;
  decode.add({0, 1, 100, true, {}}, 100);
  const double act_swiglu = 2.0 * 2 * (4 * 64 + 2 * 256) * 2, act_gelu = 2.0 * 2 * (4 * 64 + 1 * 256) * 2;
  CHECK(AnalyticalCostModel(swiglu, hw).estimate(decode).gemm_s ==
        doctest::Approx(((122880.0 + 64000) * 2 + act_swiglu) / 1e9).epsilon(1e-12));
  CHECK(AnalyticalCostModel(gelu, hw).estimate(decode).gemm_s ==
        doctest::Approx(((90112.0 + 64000) * 2 + act_gelu) / 1e9).epsilon(1e-12));
}

TEST_CASE("model presets: parameter counts as published, and the shapes the cost model needs") {
  const auto params = [](const char* name) { return model_preset(name)->params() / 1e9; };
  // Published sizes: OPT-13B 12.85B and OPT-175B 174.6B (tied LM head, learned positions), Llama-2
  // 70B 68.98B, Falcon-180B about 180B (untied). Counted here without biases and norms.
  CHECK(params("opt-13b") == doctest::Approx(12.85).epsilon(0.002));
  CHECK(params("opt-175b") == doctest::Approx(174.6).epsilon(0.002));
  CHECK(params("opt-66b") == doctest::Approx(65.7).epsilon(0.005));
  CHECK(params("llama2-70b") == doctest::Approx(68.98).epsilon(0.002));
  CHECK(params("llama2-13b") == doctest::Approx(13.0).epsilon(0.01));
  CHECK(params("llama3-70b") == doctest::Approx(70.55).epsilon(0.002));
  CHECK(params("mistral-7b") == doctest::Approx(7.24).epsilon(0.002));
  CHECK(params("yi-34b") == doctest::Approx(34.39).epsilon(0.005));
  CHECK(params("falcon-180b") == doctest::Approx(179.5).epsilon(0.005));
  CHECK(model_preset("opt-13b")->mlp == "relu");
  CHECK(model_preset("opt-13b")->positions == "learned");
  CHECK(model_preset("falcon-180b")->mlp == "gelu");
  CHECK(model_preset("falcon-180b")->positions == "rope");
  CHECK(model_preset("llama2-70b")->mlp == "swiglu");
}

TEST_CASE("the cost model charges tensor parallelism: compute over N, two all-reduces per layer") {
  const Workload w = parse_workload(
      "model: llama3-8b\nhardware: h200\nrequests: {count: 1, arrival: {process: burst}, "
      "prompt_len: 10, output_len: 2}\n",
      "w.yaml");
  StepPlan p;
  p.add({0, 2048, 0, true, {}}, 2048);
  const StepCost one = AnalyticalCostModel(w.model, w.hardware, 1).estimate(p);
  const StepCost two = AnalyticalCostModel(w.model, w.hardware, 2).estimate(p);
  CHECK(one.comm_s == 0);
  // A 2k-token prefill is compute-bound: the linear part halves, the LM head row does not.
  const double lm = 2.0 * 4096 * 128256 / 788e12;
  CHECK(two.gemm_s - lm == doctest::Approx((one.gemm_s - lm) / 2).epsilon(1e-9));
  CHECK(two.attention_s == doctest::Approx(one.attention_s / 2).epsilon(1e-9));
  const double ar = 8e-6 + 2.0 * 0.5 * 2048 * 4096 * 2 / 450e9;  // latency + ring traffic
  CHECK(two.comm_s == doctest::Approx(2 * 32 * ar).epsilon(1e-9));
  std::string bad =
      "model: llama3-8b\nhardware: {peak_tflops: 1, mem_bandwidth_tbs: 1, step_overhead_us: 1, memory_gb: 100}\n"
      "engine: {tp: 2}\nrequests: {count: 1, arrival: {process: burst}, prompt_len: 10, output_len: 2}\n";
  CHECK_THROWS_WITH_AS(parse_workload(bad, "w.yaml"), doctest::Contains("needs hardware.link_bandwidth_gbs"),
                       InputError);
  bad.replace(bad.find("tp: 2"), 5, "tp: 3");
  bad.replace(bad.find("memory_gb: 100"), 14, "memory_gb: 100, link_bandwidth_gbs: 50");
  CHECK_THROWS_WITH_AS(parse_workload(bad, "w.yaml"), doctest::Contains("'engine.tp': 3 does not divide"), InputError);
}

namespace {
// Stage 4's shape at test size: prompts and answers of a few hundred tokens arriving faster than
// one instance serves them, every answer at least two tokens (so every request moves to D).
const char* kPdWorkload = R"(model: llama3-8b
hardware: h200
engine: {max_num_batched_tokens: 2048}
requests:
  count: 80
  arrival: {process: poisson, rate: 40}
  prompt_len: {dist: uniform, min: 200, max: 3000}
  output_len: {dist: uniform, min: 2, max: 200}
)";
const Override kPd{"disaggregation.enabled", "true"};
}  // namespace

TEST_CASE("layout: one instance, TP 2, data_parallel replicas and 1P1D record instances, roles, ranks, GPUs, channel") {
  struct Case {
    std::vector<Override> set;
    std::vector<std::string> roles;
    int32_t ranks, gpus, data_parallel;
    bool pd;
    std::string channel, first_token_from, text;
  };
  const std::vector<Case> cases = {
      {{}, {"colocated"}, 1, 1, 1, false, "", "colocated", "1 instance, 1 GPU"},
      {{{"engine.tp", "2"}}, {"colocated"}, 2, 2, 1, false, "", "colocated", "1 instance (TP 2), 2 GPUs"},
      {{{"engine.data_parallel", "2"}},
       {"colocated", "colocated"},
       2,
       2,
       2,
       false,
       "",
       "colocated",
       "2 colocated replicas (data_parallel, TP 1 each), 2 GPUs"},
      {{kPd},
       {"prefill", "decode"},
       2,
       2,
       1,
       true,
       "sim",
       "prefill",
       "1P1D (prefill TP 1 + decode TP 1, sim channel), 2 GPUs"},
      {{kPd, {"disaggregation.decode.tp", "2"}, {"disaggregation.first_token_from", "decode"}},
       {"prefill", "decode"},
       3,
       3,
       1,
       true,
       "sim",
       "decode",
       "1P1D (prefill TP 1 + decode TP 2, sim channel), 3 GPUs"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.text);
    Run run(kPdWorkload, c.set);
    const Summary s = run.engine->run();
    const RunLayout& l = s.layout;
    REQUIRE(l.instances.size() == c.roles.size());
    for (size_t i = 0; i < c.roles.size(); ++i) {
      CHECK(l.instances[i].id == int32_t(i));
      CHECK(l.instances[i].role == c.roles[i]);
      CHECK(l.instances[i].backend == "sim");
      CHECK(l.instances[i].gpus == l.instances[i].tp);  // simulated: each rank a GPU of `hardware`
      CHECK(l.instances[i].kv_blocks == s.instances[i].kv_blocks);
    }
    CHECK(l.num_ranks() == c.ranks);
    CHECK(l.num_gpus() == c.gpus);
    CHECK(l.data_parallel == c.data_parallel);
    CHECK(l.disaggregation == c.pd);
    CHECK(l.channel == c.channel);
    CHECK(l.first_token_from == c.first_token_from);
    // summary.json holds the same record; its words are what the stdout header and compare print.
    const nlohmann::json j = summary_json(s, run.w);
    REQUIRE(j.contains("layout"));
    CHECK(j["layout"]["num_instances"] == c.roles.size());
    CHECK(j["layout"]["num_gpus"] == c.gpus);
    CHECK(j["layout"]["num_ranks"] == c.ranks);
    CHECK(j["layout"]["data_parallel"] == c.data_parallel);
    CHECK(j["layout"]["disaggregation"] == c.pd);
    CHECK(j["layout"]["channel"] == (c.pd ? nlohmann::json(c.channel) : nlohmann::json(nullptr)));
    CHECK(j["layout"]["first_token_from"] == c.first_token_from);
    CHECK(layout_text(j["layout"]) == c.text);
    std::ostringstream out;
    print_summary(out, s);
    CHECK(out.str().find("layout " + c.text + ";") != std::string::npos);
  }
  // A summary.json from before the layout was recorded.
  CHECK(layout_text(nlohmann::json()) == "layout unknown");
  CHECK(layout_brief(nlohmann::json::object()) == "unknown");
}

TEST_CASE("kv_cache: one instance keeps its figures; several give each pool's own, never one mixed figure") {
  Run one(kPdWorkload);
  const Summary s1 = one.engine->run();
  const nlohmann::json j1 = summary_json(s1, one.w);
  CHECK(j1["kv_cache"]["blocks"] == one.w.engine.resolved_kv_blocks);
  CHECK(j1["kv_cache"]["mean_util"] == s1.kv_mean_util);
  CHECK(j1["kv_cache"]["peak_util"] == s1.kv_peak_util);
  CHECK_FALSE(j1["kv_cache"].contains("instances"));
  REQUIRE(j1["instances"].size() == 1);  // one entry per instance, one here
  CHECK(j1["instances"][0]["kv_peak_util"] == s1.kv_peak_util);

  // P's pool small, D's twice as large: each pool's use is its own.
  Run pd(kPdWorkload,
         {kPd, {"disaggregation.prefill.num_kv_blocks", "3000"}, {"disaggregation.decode.num_kv_blocks", "6000"}});
  const Summary s = pd.engine->run();
  const nlohmann::json j = summary_json(s, pd.w);
  const nlohmann::json& kv = j["kv_cache"];
  CHECK(kv["blocks"] == 9000);
  CHECK_FALSE(kv.contains("mean_util"));  // no figure over two pools
  CHECK_FALSE(kv.contains("peak_util"));
  REQUIRE(kv["instances"].size() == 2);
  CHECK(kv["instances"][0]["role"] == "prefill");
  CHECK(kv["instances"][0]["blocks"] == 3000);
  CHECK(kv["instances"][1]["role"] == "decode");
  CHECK(kv["instances"][1]["blocks"] == 6000);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(kv["instances"][i]["peak_util"] == s.instances[i].kv_peak_util);
    CHECK(kv["instances"][i]["mean_util"] == s.instances[i].kv_mean_util);
    CHECK(s.instances[i].kv_peak_util > 0);
    CHECK(s.instances[i].steps > 0);
    CHECK(s.instances[i].busy_fraction > 0);
    CHECK(s.instances[i].busy_fraction <= 1);
  }
  // Each peak is over its own pool: D's peak in blocks is what D held, not a share of P's pool.
  int32_t d_peak = 0;
  struct Peak : run_observer_i {
    int32_t* peak;
    explicit Peak(int32_t* p) : peak(p) {}
    void on_step(const StepRecord& r) override {
      if (r.instance == 1) *peak = std::max(*peak, r.kv_used);
    }
  } watch(&d_peak);
  Run again(kPdWorkload,
            {kPd, {"disaggregation.prefill.num_kv_blocks", "3000"}, {"disaggregation.decode.num_kv_blocks", "6000"}});
  again.engine->add_observer(&watch);
  again.engine->run();
  CHECK(d_peak > 0);
  CHECK(s.instances[1].kv_peak_util == doctest::Approx(d_peak / 6000.0));
}

TEST_CASE("1P1D first_token_from: decode: TTFT is the after-transfer figure; TPOT, ITL and goodput follow") {
  Run at_p(kPdWorkload, {kPd}), at_d(kPdWorkload, {kPd, {"disaggregation.first_token_from", "decode"}});
  const Summary p = at_p.engine->run(), d = at_d.engine->run();
  REQUIRE(p.finished == 80);
  REQUIRE(d.finished == 80);
  REQUIRE(d.disaggregation.delivered == 80);  // every request moved: none could pass vacuously
  // The default (prefill) counts P's token, before the transfer: earlier than D's.
  CHECK(p.layout.first_token_from == "prefill");
  CHECK(p.ttft_ms.p50 < p.disaggregation.ttft_after_transfer_ms.p50);
  // decode: TTFT is the after-transfer figure, exactly.
  CHECK(d.layout.first_token_from == "decode");
  const Percentiles &t = d.ttft_ms, &a = d.disaggregation.ttft_after_transfer_ms;
  CHECK(t.n == a.n);
  CHECK(t.mean == a.mean);
  CHECK(t.p50 == a.p50);
  CHECK(t.p90 == a.p90);
  CHECK(t.p99 == a.p99);
  CHECK(t.max == a.max);
  // The schedule is the same (which token the client sees changes no step): the after-transfer
  // figure is the same in both runs, and so is every request's last token and finish.
  CHECK(p.disaggregation.ttft_after_transfer_ms.mean == a.mean);
  const topology_i& h = at_d.engine->topology();
  REQUIRE(h.moves_kv());
  int64_t later = 0;
  for (size_t i = 0; i < at_d.engine->requests().size(); ++i) {
    const Request &rp = at_p.engine->requests()[i], &rd = at_d.engine->requests()[i];
    CHECK(rd.first_token == h.transfer_of(rd.id).end);
    CHECK(rp.first_token == h.transfer_of(rd.id).parked);
    CHECK(rd.last_token == rp.last_token);
    CHECK(rd.finish == rp.finish);
    later += rd.first_token > rp.first_token;
  }
  CHECK(later == 80);
  // TPOT and ITL count from D's first token: the transfer is in TTFT, not in the first gap.
  CHECK(d.tpot_ms.mean < p.tpot_ms.mean);
  CHECK(d.itl_ms.n == p.itl_ms.n);
  CHECK(d.itl_ms.max < p.itl_ms.max);
  // The SLO follows: a TTFT bound between P's and D's medians.
  const double slo = (p.ttft_ms.p50 + a.p50) / 2;
  const std::vector<Override> bound{kPd, {"slo.ttft_ms", fmt::format("{}", slo)}};
  std::vector<Override> bound_d = bound;
  bound_d.push_back({"disaggregation.first_token_from", "decode"});
  Run gp(kPdWorkload, bound), gd(kPdWorkload, bound_d);
  const Summary sp = gp.engine->run(), sd = gd.engine->run();
  int64_t within = 0;
  for (const Request& r : gd.engine->requests())
    within += to_ms(gd.engine->topology().transfer_of(r.id).end - r.arrival) <= slo;
  CHECK(sd.goodput_fraction == doctest::Approx(double(within) / 80));
  CHECK(sd.goodput_fraction < sp.goodput_fraction);
  CHECK(sp.goodput_fraction >= 0.5);
  CHECK(sd.goodput_fraction <= 0.5);
}

namespace {
// An executor priced as the simulator prices it but named as the CPU backend: its instances hold
// no GPU (InstanceLayout::gpus 0), as the CPU backend's ranks do.
struct CpuNamedExecutor final : executor_i {
  SimExecutor inner;
  explicit CpuNamedExecutor(const Workload& w) : inner(std::make_unique<AnalyticalCostModel>(w.model, w.hardware)) {}
  StepResult execute(const StepPlan& plan) override { return inner.execute(plan); }
  std::string name() const override { return "cpu"; }
  bool simulated() const override { return true; }
};

// The cost model's hand-priced shape (above): linear_params 122,880; one request, a 100-token
// prompt and 4 output tokens, on 1 TFLOP/s GPUs.
const char* kFlopsWorkload = R"(model: {name: hand, layers: 2, hidden: 64, heads: 4, kv_heads: 2, ffn: 256, vocab: 1000,
        dtype: fp16, max_model_len: 512}
hardware: {peak_tflops: 1, mem_bandwidth_tbs: 1, step_overhead_us: 10, memory_gb: 1, link_bandwidth_gbs: 50,
           link_latency_us: 1}
requests: {count: 1, arrival: {process: burst}, prompt_len: 100, output_len: 4}
)";
}  // namespace

// Model FLOPs by hand. The prefill step: 100 tokens, 1 sample, 100 x 101 / 2 = 5,050 causal pairs.
// Three decode steps of one token after 100, 101, 102 computed: 101 + 102 + 103 = 306 pairs.
//   linear    2 x 122,880 x tokens; lm_head 2 x 64 x 1,000 x samples; attention 4 x 2 x 4 x 16 x pairs
//   prefill   24,576,000 + 128,000 + 2,585,600 = 27,289,600
//   decodes      737,280 + 384,000 +   156,672 =  1,277,952
//   run       25,313,280 + 512,000 + 2,742,272 = 28,567,552
TEST_CASE("MFU: a run's model FLOPs counted by hand at TP 1, TP 2 and 1P1D, over its GPUs' peak") {
  StepPlan prefill;
  prefill.add({0, 100, 0, true, {}}, 100);
  const Workload hand = parse_workload(kFlopsWorkload, "w.yaml");
  const StepFlops pf = step_flops(hand.model, prefill);
  CHECK(pf.linear == 24576000.0);
  CHECK(pf.lm_head == 128000.0);
  CHECK(pf.attention == 2585600.0);
  CHECK(pf.total() == 27289600.0);
  const double run_flops = 28567552.0, p_flops = 27289600.0, d_flops = 1277952.0;
  const auto mfu = [](double flops, double seconds, double gpus) { return flops / (seconds * gpus * 1e12); };

  for (const char* tp : {"1", "2"}) {
    CAPTURE(tp);
    Run run(kFlopsWorkload, {{"engine.tp", tp}});
    const Summary s = run.engine->run();
    const double gpus = std::stod(tp);
    REQUIRE(s.finished == 1);
    REQUIRE(s.instances.size() == 1);
    CHECK(s.steps == 4);
    CHECK(s.instances[0].model_flops == run_flops);  // the same FLOPs however many ranks share them
    CHECK(s.utilisation.model_flops == run_flops);
    CHECK(s.utilisation.gpus == int32_t(gpus));
    REQUIRE(s.utilisation.peak_flops_per_gpu);
    CHECK(*s.utilisation.peak_flops_per_gpu == 1e12);
    REQUIRE(s.utilisation.mfu);
    CHECK(*s.utilisation.mfu == mfu(run_flops, s.makespan_s, gpus));
    REQUIRE(s.instances[0].mfu);
    CHECK(*s.instances[0].mfu == *s.utilisation.mfu);
    CHECK(*s.utilisation.mfu > 0);
    CHECK(*s.utilisation.mfu < 1);
    const nlohmann::json j = summary_json(s, run.w);
    CHECK(j["utilisation"]["model_flops"] == run_flops);
    CHECK(j["utilisation"]["gpus"] == int32_t(gpus));
    CHECK(j["utilisation"]["peak_tflops_per_gpu"] == 1.0);
    CHECK(j["utilisation"]["mfu"] == *s.utilisation.mfu);
    CHECK(j["instances"][0]["model_flops"] == run_flops);
    CHECK(j["instances"][0]["mfu"] == *s.instances[0].mfu);
  }

  // 1P1D: P computes the prompt and samples the first token, D the three decodes; each instance's
  // MFU over its own GPU, the run's over both.
  Run pd(kFlopsWorkload, {kPd});
  const Summary s = pd.engine->run();
  REQUIRE(s.finished == 1);
  REQUIRE(s.instances.size() == 2);
  CHECK(s.instances[0].role == "prefill");
  CHECK(s.instances[0].model_flops == p_flops);
  CHECK(s.instances[1].model_flops == d_flops);
  CHECK(s.utilisation.model_flops == run_flops);
  CHECK(s.utilisation.gpus == 2);
  REQUIRE(s.instances[0].mfu);
  REQUIRE(s.instances[1].mfu);
  CHECK(*s.instances[0].mfu == mfu(p_flops, s.makespan_s, 1));
  CHECK(*s.instances[1].mfu == mfu(d_flops, s.makespan_s, 1));
  REQUIRE(s.utilisation.mfu);
  CHECK(*s.utilisation.mfu == mfu(run_flops, s.makespan_s, 2));
}

TEST_CASE("MFU is unknown, never made up, without a peak: no GPU (CPU backend), a fitted hardware profile") {
  // The CPU backend's instances hold no GPU: FLOPs counted, no MFU.
  const Workload w = parse_workload(kFlopsWorkload, "w.yaml");
  CpuNamedExecutor cpu(w);
  VirtualClock clock;
  Engine on_cpu(w, generate_requests(w), cpu, clock);
  const Summary c = on_cpu.run();
  CHECK(c.utilisation.model_flops == 28567552.0);
  CHECK(c.utilisation.gpus == 0);
  CHECK_FALSE(c.utilisation.peak_flops_per_gpu);
  CHECK_FALSE(c.utilisation.mfu);
  CHECK_FALSE(c.instances[0].mfu);
  const nlohmann::json j = summary_json(c, w);
  CHECK(j["utilisation"]["mfu"].is_null());
  CHECK(j["utilisation"]["peak_tflops_per_gpu"].is_null());
  CHECK(j["instances"][0]["mfu"].is_null());

  // A fitted profile prices steps from measured coefficients and has no peak.
  std::string fitted = kFlopsWorkload;
  const size_t at = fitted.find("hardware:");
  fitted.replace(at, fitted.find("requests:") - at,
                 "hardware: {memory_gb: 1, fitted: {backend: cpu, model: hand, overhead_us: 10, per_token_us: 1, "
                 "per_seq_us: 0, per_attn_pair_ns: 0, per_context_token_ns: 0, per_sample_us: 0}}\n");
  const Workload fw = parse_workload(fitted, "w.yaml");
  REQUIRE(fw.hardware.fitted);
  SimExecutor fitted_exec(make_cost_model(fw.model, fw.hardware));
  VirtualClock fitted_clock;
  Engine on_fitted(fw, generate_requests(fw), fitted_exec, fitted_clock);
  const Summary f = on_fitted.run();
  CHECK(f.utilisation.model_flops == 28567552.0);
  CHECK(f.utilisation.gpus == 1);
  CHECK_FALSE(f.utilisation.mfu);
  CHECK_FALSE(f.instances[0].mfu);
  CHECK_FALSE(model_flops_utilisation(1e12, 1, 1, std::nullopt));
  CHECK_FALSE(model_flops_utilisation(1e12, 0, 1, 1e12));
  CHECK(*model_flops_utilisation(1e12, 2, 1, 1e12) == 0.5);
}
