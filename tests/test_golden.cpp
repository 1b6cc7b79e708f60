// Golden suite: feature off vs on, same prompts, greedy decoding, real backend (CPU):
// every request's output tokens identical. Scheduling changes performance, never results.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <tuple>

#include "backend/cpu/cpu_executor.h"
#include "sim/engine/engine.h"
#include "backend/transfer/channel_kind.h"
#include "backend/transfer/channels.h"
#include "sim/run/executors.h"
#include "sim/run/run_setup.h"
#include "tests/golden.h"
#include "tests/test_helpers.h"

namespace tandem::testing {

namespace {
// The CPU backend under the virtual clock, not warmed up: tokens are compared, not step times.
const RunSetupOptions kCpuVirtual{.backend = "cpu", .clock = "virtual", .warm_up = false};
// One workload on the CPU backend; the callers check how its requests ended.
struct CpuRun {
  std::vector<std::vector<Token>> outputs;
  std::vector<Request> requests;
  Summary summary;
};

CpuRun run_on_cpu(const std::string& workload, const std::vector<Override>& overrides,
                  run_observer_i* observer = nullptr) {
  // One executor per instance, and the KV channel (1P1D). The virtual clock: measured step
  // times, no waiting between events: fast and still a real backend.
  RunSetup setup(load_workload(workload, overrides), kCpuVirtual);
  Engine& e = setup.start(generate_requests(setup.workload));
  if (observer) e.add_observer(observer);
  CpuRun run;
  run.summary = e.run();
  run.outputs = e.outputs();
  run.requests = e.requests();
  return run;
}
}  // namespace

std::vector<std::vector<Token>> golden_outputs(const std::string& workload, const std::vector<Override>& overrides) {
  CpuRun run = run_on_cpu(workload, overrides);
  for (const Request& r : run.requests)
    if (r.status != RequestStatus::Finished || int32_t(run.outputs[size_t(r.id)].size()) != r.max_output)
      throw std::runtime_error(fmt::format("request {} ended {} with {} tokens", r.id, to_string(r.status),
                                           run.outputs[size_t(r.id)].size()));
  return std::move(run.outputs);
}

std::string first_divergence(const std::vector<std::vector<Token>>& base,
                             const std::vector<std::vector<Token>>& other) {
  if (base.size() != other.size()) return fmt::format("{} vs {} requests", base.size(), other.size());
  for (size_t r = 0; r < base.size(); ++r) {
    const size_t n = std::min(base[r].size(), other[r].size());
    for (size_t p = 0; p < n; ++p)
      if (base[r][p] != other[r][p])
        return fmt::format("request {} diverges at output position {}: {} vs {}", r, p, base[r][p], other[r][p]);
    if (base[r].size() != other[r].size())
      return fmt::format("request {}: {} vs {} tokens", r, base[r].size(), other[r].size());
  }
  return "";
}

}  // namespace tandem::testing

using namespace tandem;
using namespace tandem::testing;

const Override kNoChunking{"engine.enable_chunked_prefill", "false"};

namespace {
// The schedule a run followed, step by step ((id, tokens, context) of every sequence), so a test
// can show that the runs it compares really scheduled differently, else it would prove nothing.
struct ScheduleLog : run_observer_i {
  std::vector<std::tuple<ReqId, int32_t, int32_t>> seqs;
  std::vector<size_t> step_ends;
  int32_t max_batch = 0;
  void on_step(const StepRecord& r) override {
    for (const ScheduledSeq& s : r.plan->seqs) seqs.push_back({s.id, s.num_tokens, s.num_computed_before});
    step_ends.push_back(seqs.size());
    max_batch = std::max(max_batch, int32_t(r.plan->seqs.size()));
  }
  bool operator==(const ScheduleLog& o) const { return seqs == o.seqs && step_ends == o.step_ends; }
};

// A CPU run watched by `observer`, every request required to finish.
std::vector<std::vector<Token>> golden_observed(const std::string& wl, const std::vector<Override>& o,
                                                run_observer_i& observer) {
  CpuRun run = run_on_cpu(wl, o, &observer);
  for (const Request& r : run.requests)
    REQUIRE_MESSAGE(r.status == RequestStatus::Finished, "request ", r.id, " ended ", to_string(r.status));
  return std::move(run.outputs);
}
}  // namespace

TEST_CASE("golden (stage 1): static vs continuous batching, and continuous at several max_num_seqs and budgets") {
  const std::string wl = source_path("workloads/golden_small.yaml");
  ScheduleLog base_log;
  const auto base =
      golden_observed(wl, {kNoChunking, {"engine.policy", "static"}, {"engine.max_num_seqs", "8"}}, base_log);
  size_t tokens = 0;
  for (const auto& o : base) tokens += o.size();
  MESSAGE("baseline: ", base.size(), " requests, ", tokens, " output tokens, ", base_log.step_ends.size(), " steps");
  const std::vector<GoldenRun> runs = {
      {"continuous, 16 seats", {kNoChunking}},
      {"continuous, 2 seats", {kNoChunking, {"engine.max_num_seqs", "2"}}},
      {"continuous, 40 seats, budget 600",
       {kNoChunking, {"engine.max_num_seqs", "40"}, {"engine.max_num_batched_tokens", "600"}}},
      {"static, 40 seats", {kNoChunking, {"engine.policy", "static"}, {"engine.max_num_seqs", "40"}}},
  };
  for (const auto& run : runs) {
    ScheduleLog log;
    const std::string diff = first_divergence(base, golden_observed(wl, run.overrides, log));
    CHECK_MESSAGE(diff.empty(), run.label, ": ", diff);
    CHECK_MESSAGE(!(log == base_log), run.label, ": scheduled exactly as the baseline, so it proves nothing");
    MESSAGE(run.label, ": ", log.step_ends.size(), " steps, at most ", log.max_batch, " sequences a step");
  }
}

namespace {
// What a run's steps carried: steps with both prompts and decodes, and running requests left out
// of a step that ran prompts (decodes stalled behind them; unchunked, every other running
// request is ready to decode).
struct CompositionCount : run_observer_i {
  int64_t mixed_steps = 0, stalled_decodes = 0, steps = 0;
  void on_step(const StepRecord& r) override {
    ++steps;
    mixed_steps += r.plan->num_prefill_seqs > 0 && r.plan->num_decode_seqs > 0;
    if (r.plan->num_prefill_seqs > 0) stalled_decodes += r.running - int64_t(r.plan->seqs.size());
  }
};
}  // namespace

// Stage 1's step composition: vLLM v0's prompts-or-decodes steps against the default mixed
// steps. The mixed runs must really have mixed and the prompts-or-decodes runs really stalled
// decodes, else the comparison would prove nothing.
TEST_CASE("golden (stage 1): step composition prompts_or_decodes vs mixed, token-identical at TP 1 and 2") {
  const std::string wl = source_path("workloads/golden_small.yaml");
  const Override pod{"engine.step_composition", "prompts_or_decodes"};
  for (const std::string tp : {"1", "2"}) {
    CAPTURE(tp);
    for (const std::string seats : {"16", "4"}) {
      CAPTURE(seats);
      const std::vector<Override> common = {kNoChunking, {"engine.tp", tp}, {"engine.max_num_seqs", seats}};
      CompositionCount mixed, stalled;
      const auto base = golden_observed(wl, common, mixed);
      std::vector<Override> o = common;
      o.push_back(pod);
      const std::string d = first_divergence(base, golden_observed(wl, o, stalled));
      CHECK_MESSAGE(d.empty(), "tp ", tp, ", ", seats, " seats, prompts_or_decodes vs mixed: ", d);
      CHECK(mixed.mixed_steps > 0);
      CHECK(stalled.mixed_steps == 0);
      CHECK(stalled.stalled_decodes > 0);
      MESSAGE("tp ", tp, ", ", seats, " seats: mixed ", mixed.steps, " steps (", mixed.mixed_steps,
              " with prompts and decodes); prompts_or_decodes ", stalled.steps, " steps, ", stalled.stalled_decodes,
              " decodes stalled behind prompts; identical");
    }
  }
}

TEST_CASE("golden x TP (CPU, in-process ranks): static vs continuous token-identical at TP 2 and 4") {
  const std::string wl = source_path("workloads/golden_small.yaml");
  for (const std::string tp : {"2", "4"}) {
    const auto base =
        golden_outputs(wl, {kNoChunking, {"engine.tp", tp}, {"engine.policy", "static"}, {"engine.max_num_seqs", "8"}});
    const std::string d1 = first_divergence(base, golden_outputs(wl, {kNoChunking, {"engine.tp", tp}}));
    CHECK_MESSAGE(d1.empty(), "tp ", tp, ", continuous 16 seats: ", d1);
    const std::string d2 =
        first_divergence(base, golden_outputs(wl, {kNoChunking, {"engine.tp", tp}, {"engine.max_num_seqs", "2"}}));
    CHECK_MESSAGE(d2.empty(), "tp ", tp, ", continuous 2 seats: ", d2);
  }
}

// The CPU backend's row-split reductions are TP-invariant (backend/cpu/llama.h): the tiny
// model's 4 segments make TP 1, 2 and 4 one function, which is what lets prefill and decode run
// at different TP (stage 4) and still give colocated tokens.
TEST_CASE("golden x TP: TP 1, 2 and 4 give the same tokens (TP-invariant reductions)") {
  const std::string wl = source_path("workloads/golden_small.yaml");
  REQUIRE(load_workload(wl, {}).model.reduction_segments() == 4);
  const auto base = golden_outputs(wl, {kNoChunking});
  for (const std::string tp : {"2", "4"}) {
    const std::string d = first_divergence(base, golden_outputs(wl, {kNoChunking, {"engine.tp", tp}}));
    CHECK_MESSAGE(d.empty(), "tp ", tp, " vs tp 1: ", d);
  }
}

// Stage 2. The baseline computes every prompt whole (chunking off, a budget that fits the
// longest prompt); the chunked runs cut prompts at budgets 16, 61 (not a block multiple),
// 512 and 4,096. Each chunked run must really have cut prompts (counted), else the test
// would prove nothing.
namespace {
struct ChunkCount : run_observer_i {
  int64_t cut = 0;  // sequences in a step that computed part of a prompt without sampling
  void on_step(const StepRecord& r) override {
    for (const ScheduledSeq& s : r.plan->seqs) cut += !s.samples;
  }
};

std::vector<std::vector<Token>> golden_chunked(const std::string& wl, std::vector<Override> o, int64_t* cut) {
  ChunkCount count;
  auto outputs = golden_observed(wl, o, count);
  *cut = count.cut;
  return outputs;
}
}  // namespace

TEST_CASE("golden (stage 2): chunked prefill on vs off, budgets 16, 61, 512, 4096, at TP 1, 2 and 4") {
  const std::string wl = source_path("workloads/golden_small.yaml");
  for (const std::string tp : {"1", "2", "4"}) {
    CAPTURE(tp);
    const auto base = golden_outputs(wl, {kNoChunking, {"engine.tp", tp}});
    struct Case {
      std::string budget, partials, policy;
    };
    std::vector<Case> cases = {
        {"16", "1", "continuous"}, {"61", "1", "continuous"}, {"512", "1", "continuous"}, {"4096", "1", "continuous"}};
    if (tp == "1")  // the knobs' other corners, once
      cases.insert(cases.end(), {{"61", "3", "continuous"}, {"128", "2", "static"}});
    for (const Case& c : cases) {
      int64_t cut = 0;
      const auto out = golden_chunked(wl,
                                      {{"engine.tp", tp},
                                       {"engine.enable_chunked_prefill", "true"},
                                       {"engine.max_num_batched_tokens", c.budget},
                                       {"engine.max_num_partial_prefills", c.partials},
                                       {"engine.policy", c.policy}},
                                      &cut);
      const std::string d = first_divergence(base, out);
      CHECK_MESSAGE(d.empty(), "tp ", tp, ", budget ", c.budget, ", partials ", c.partials, ", ", c.policy, ": ", d);
      MESSAGE("tp ", tp, ", budget ", c.budget, ", partials ", c.partials, ", ", c.policy, ": ", cut,
              " prompt chunks that did not sample");
      // Budget 4096 exceeds every prompt (max 500), so prompts are cut only when several arrive at once.
      if (c.budget != "4096") CHECK_MESSAGE(cut > 0, "budget ", c.budget, ": no prompt was cut");
    }
  }
}

// Stage 3. The baseline computes every prompt whole with prefix caching off; the runs with
// caching on take cached leading blocks instead (unchunked, and chunked at 16, 61 and 512),
// once with a KV cache so small that cached blocks are evicted mid-run. The workload
// (workloads/golden_prefix.yaml) has groups sharing 200- and 240-token prefixes, prompts
// sharing all but their last token, prompts that are prefixes of each other, identical
// prompts, and prompts of no group. Every run with caching on must have hit (and the small
// cache evicted), else the test would prove nothing.
namespace {
struct PrefixRun {
  std::vector<std::vector<Token>> outputs;
  Summary summary;
  int64_t last_token_only = 0;  // requests whose hit left only the last prompt token to compute
  int64_t inside_prefix = 0;  // hits of a prompt no longer than its group's prefix (identical, or a prefix of another)
};

PrefixRun golden_prefix(const std::string& wl, const std::vector<Override>& o) {
  CpuRun cpu = run_on_cpu(wl, o);
  PrefixRun run;
  run.summary = cpu.summary;
  for (const Request& r : cpu.requests) {
    REQUIRE_MESSAGE(r.status == RequestStatus::Finished, "request ", r.id, " ended ", to_string(r.status));
    REQUIRE(int32_t(cpu.outputs[size_t(r.id)].size()) == r.max_output);
    run.last_token_only += r.num_cached_tokens > 0 && r.num_cached_tokens == r.prompt_len - 1;
    run.inside_prefix += r.num_cached_tokens > 0 && r.prefix_group >= 0 && r.prefix_len == r.prompt_len;
  }
  run.outputs = std::move(cpu.outputs);
  return run;
}
}  // namespace

TEST_CASE(
    "golden (stage 3): prefix caching on vs off, unchunked and chunked at 16, 61, 512, a cache that evicts, at TP 1, 2 "
    "and 4") {
  const std::string wl = source_path("workloads/golden_prefix.yaml");
  const Override caching_off{"engine.enable_prefix_caching", "false"},
      caching_on{"engine.enable_prefix_caching", "true"};
  const auto chunked = [](const std::string& budget) {
    return std::vector<Override>{{"engine.enable_chunked_prefill", "true"}, {"engine.max_num_batched_tokens", budget}};
  };
  struct Case {
    std::string label;
    std::vector<Override> overrides;
    bool evicts;
  };
  std::vector<Case> cases = {{"unchunked", {kNoChunking}, false},
                             {"chunked at 16", chunked("16"), false},
                             {"chunked at 61", chunked("61"), false},
                             {"chunked at 512", chunked("512"), false}};
  // 40 blocks of 16 (the longest request needs 33): cached blocks are reused for new KV while
  // later requests still arrive.
  cases.push_back({"chunked at 61, 40 KV blocks", chunked("61"), true});
  cases.back().overrides.push_back({"engine.num_kv_blocks", "40"});
  for (const std::string tp : {"1", "2", "4"}) {
    CAPTURE(tp);
    const PrefixRun base = golden_prefix(wl, {kNoChunking, caching_off, {"engine.tp", tp}});
    CHECK(base.summary.prefix_hit_tokens == 0);
    int64_t last_token_only = 0, inside_prefix = 0;
    for (const Case& c : cases) {
      std::vector<Override> o = c.overrides;
      o.push_back(caching_on);
      o.push_back({"engine.tp", tp});
      const PrefixRun run = golden_prefix(wl, o);
      const Summary& s = run.summary;
      const std::string d = first_divergence(base.outputs, run.outputs);
      CHECK_MESSAGE(d.empty(), "tp ", tp, ", caching on, ", c.label, ": ", d);
      MESSAGE("tp ", tp, ", caching on, ", c.label, ": ", s.prefix_hit_tokens, " of ", s.prefix_queried_tokens,
              " prompt tokens hit (", s.prefix_hits, " of ", s.prefix_queries, " requests; ", run.last_token_only,
              " computed only their last token, ", run.inside_prefix, " hits inside a group prefix), ",
              s.prefix_evictions, " evictions");
      CHECK_MESSAGE(s.prefix_hit_tokens > 0, c.label, ": no prefix hit");
      if (c.evicts) CHECK_MESSAGE(s.prefix_evictions > 0, c.label, ": no cached block was evicted");
      last_token_only += run.last_token_only;
      inside_prefix += run.inside_prefix;
    }
    CHECK_MESSAGE(last_token_only > 0, "no run had a prompt hit up to its last token");
    CHECK_MESSAGE(inside_prefix > 0, "no run had a hit of an identical prompt or a prompt inside a group prefix");
  }
}

TEST_CASE(
    "golden (stage 4): 1P1D over the copy channel vs colocated, token-identical: TP 1 and 2, chunked and not, caching "
    "on and off, and a prefill cache that evicts") {
  const std::string wl = source_path("workloads/golden_prefix.yaml");
  const Override pd{"disaggregation.enabled", "true"}, copy{"disaggregation.channel.kind", "copy"};
  struct Case {
    std::string label;
    std::vector<Override> overrides;
    bool evicts;
  };
  const std::vector<Case> cases = {
      {"unchunked, caching off", {kNoChunking, {"engine.enable_prefix_caching", "false"}}, false},
      {"unchunked, caching on", {kNoChunking}, false},
      {"chunked at 61, caching off", {{"engine.max_num_batched_tokens", "61"}, {"engine.enable_prefix_caching", "false"}}, false},
      {"chunked at 61, caching on", {{"engine.max_num_batched_tokens", "61"}}, false},
      // 40 blocks on P (the longest prompt needs 31): cached blocks are evicted while prompts
      // still arrive; D keeps the engine's 512.
      {"chunked at 61, caching on, P holds 40 blocks", {{"engine.max_num_batched_tokens", "61"},
                                                        {"disaggregation.prefill.num_kv_blocks", "40"}}, true},
  };
  for (const std::string tp : {"1", "2"}) {
    CAPTURE(tp);
    const CpuRun base = run_on_cpu(wl, {kNoChunking, {"engine.enable_prefix_caching", "false"}, {"engine.tp", tp}});
    for (const Case& c : cases) {
      std::vector<Override> o = c.overrides;
      o.insert(o.end(), {pd, copy, {"engine.tp", tp}});
      const CpuRun run = run_on_cpu(wl, o);
      const Summary& s = run.summary;
      for (const Request& r : run.requests)
        REQUIRE_MESSAGE(r.status == RequestStatus::Finished, c.label, ": request ", r.id, " ended ", to_string(r.status));
      const std::string d = first_divergence(base.outputs, run.outputs);
      CHECK_MESSAGE(d.empty(), "tp ", tp, ", 1P1D, ", c.label, ": ", d);
      // Every request with more than one output token moved its KV: none could pass vacuously.
      int64_t multi = 0;
      for (const Request& r : run.requests) multi += r.max_output > 1;
      CHECK(s.disaggregation.enabled);
      CHECK(s.disaggregation.delivered == multi);
      CHECK(s.disaggregation.delivered > 0);
      CHECK(s.disaggregation.bytes > 0);
      CHECK(s.disaggregation.failed == 0);
      if (c.evicts) CHECK_MESSAGE(s.prefix_evictions > 0, c.label, ": no cached block was evicted");
      MESSAGE("tp ", tp, ", 1P1D copy, ", c.label, ": ", s.disaggregation.delivered, " transfers, ",
              s.disaggregation.bytes, " bytes, ", s.prefix_hit_tokens, " prompt tokens hit, ", s.prefix_evictions,
              " evictions; identical");
    }
  }
}

TEST_CASE(
    "golden (stage 4): prefill and decode at different TP (1, 2, 4 each) over the copy channel give colocated TP 1's "
    "tokens; the blocks are re-laid out exactly when the TPs differ") {
  const std::string wl = source_path("workloads/golden_prefix.yaml");
  const CpuRun base = run_on_cpu(wl, {kNoChunking, {"engine.enable_prefix_caching", "false"}});
  for (const std::string p_tp : {"1", "2", "4"})
    for (const std::string d_tp : {"1", "2", "4"}) {
      CAPTURE(p_tp);
      CAPTURE(d_tp);
      // Chunked at 61 with prefix hits on P: the moved blocks hold computed and cached KV alike.
      Workload w = load_workload(wl, {{"engine.max_num_batched_tokens", "61"},
                                      {"disaggregation.enabled", "true"},
                                      {"disaggregation.channel.kind", "copy"},
                                      {"disaggregation.prefill.tp", p_tp},
                                      {"disaggregation.decode.tp", d_tp}});
      RunSetup run(std::move(w), kCpuVirtual);
      const auto* copy = dynamic_cast<const CopyChannel*>(run.exec.channel);
      REQUIRE(copy);
      CHECK(copy->relayouts() == (p_tp != d_tp));
      Engine& e = run.start(generate_requests(run.workload));
      const Summary s = e.run();
      for (const Request& r : e.requests())
        REQUIRE_MESSAGE(r.status == RequestStatus::Finished, "request ", r.id, " ended ", to_string(r.status));
      const std::string d = first_divergence(base.outputs, e.outputs());
      CHECK_MESSAGE(d.empty(), "P tp ", p_tp, ", D tp ", d_tp, ": ", d);
      int64_t multi = 0;
      for (const Request& r : e.requests()) multi += r.max_output > 1;
      CHECK(s.disaggregation.delivered == multi);
      CHECK(s.disaggregation.delivered > 0);
      CHECK(s.prefix_hit_tokens > 0);
      MESSAGE("P tp ", p_tp, ", D tp ", d_tp, ": ", s.disaggregation.delivered, " transfers",
              std::string(copy->relayouts() ? " re-laid out" : ""), ", ", s.prefix_hit_tokens, " prompt tokens hit; identical");
    }
}

TEST_CASE(
    "a channel kind added by one row (register_channel_kind, here in this test alone) is accepted by the workload "
    "parser and the run's wiring, and gives 1P1D golden tokens") {
  // A relay around the copy channel that counts what it moved: the row is all that names it.
  struct Relay final : kv_channel_i {
    CopyChannel inner;
    int64_t& moved;
    Relay(kv_store_i& from, kv_store_i& to, int64_t& n) : inner(from, to), moved(n) {}
    std::string name() const override { return "test-relay"; }
    TransferStart start(const KvTransfer& t) override {
      ++moved;
      return inner.start(t);
    }
    bool abort(uint64_t ticket, Time now) override { return inner.abort(ticket, now); }
  };
  static int64_t moved = 0;
  register_channel_kind({.name = "test-relay",
                         .where = "one process, through a test's relay",
                         .in_process = [](kv_store_i& from, kv_store_i& to) -> std::unique_ptr<kv_channel_i> {
                           return std::make_unique<Relay>(from, to, moved);
                         }});
  REQUIRE(find_channel_kind("test-relay"));
  const std::string wl = source_path("workloads/golden_prefix.yaml");
  const CpuRun base = run_on_cpu(wl, {kNoChunking, {"engine.enable_prefix_caching", "false"}});
  const CpuRun run = run_on_cpu(wl, {{"engine.max_num_batched_tokens", "61"},
                                     {"disaggregation.enabled", "true"},
                                     {"disaggregation.channel.kind", "test-relay"}});
  for (const Request& r : run.requests)
    REQUIRE_MESSAGE(r.status == RequestStatus::Finished, "request ", r.id, " ended ", to_string(r.status));
  const std::string d = first_divergence(base.outputs, run.outputs);
  CHECK_MESSAGE(d.empty(), d);
  CHECK(run.summary.disaggregation.channel == "test-relay");
  CHECK(moved > 0);  // exercised: the relay moved every transfer
  CHECK(run.summary.disaggregation.delivered == moved);
  // A kind no row has is refused where the workload names it.
  CHECK_THROWS_WITH_AS(load_workload(wl, {{"disaggregation.enabled", "true"}, {"disaggregation.channel.kind", "nope"}}),
                       doctest::Contains("unknown channel 'nope' (known: sim, copy, tcp, nccl, test-relay)"),
                       InputError);
}

TEST_CASE("mutation: blocks moved between TPs without the re-layout give other tokens (the check above can fail)") {
  // The copy channel's re-layout switched off by hand: what the descriptors prevent.
  const std::string wl = source_path("workloads/golden_prefix.yaml");
  const CpuRun base = run_on_cpu(wl, {kNoChunking, {"engine.enable_prefix_caching", "false"}});
  Workload w = load_workload(wl, {kNoChunking,
                                  {"disaggregation.enabled", "true"},
                                  {"disaggregation.channel.kind", "copy"},
                                  {"disaggregation.decode.tp", "2"}});
  RunSetup run(std::move(w), kCpuVirtual);
  struct RawBytes final : kv_channel_i {  // moves the bytes as they are, as before the descriptors
    kv_store_i &from, &to;
    RawBytes(kv_store_i& f, kv_store_i& t) : from(f), to(t) {}
    std::string name() const override { return "raw"; }
    bool abort(uint64_t, Time) override { return true; }
    TransferStart start(const KvTransfer& t) override {
      std::vector<std::byte> buf(t.src_blocks.size() * size_t(from.block_bytes()));
      from.read_blocks(t.src_blocks, buf);
      to.write_blocks(t.dst_blocks, buf);
      return {.async = false, .ok = true, .elapsed = 0, .bytes = int64_t(buf.size()), .error = {}};
    }
  } raw(*run.exec.executors[0]->kv_store(), *run.exec.executors[1]->kv_store());
  run.exec.channel = &raw;
  Engine& e = run.start(generate_requests(run.workload));
  e.run();
  CHECK_FALSE(first_divergence(base.outputs, e.outputs()).empty());
}

TEST_CASE("the comparison names the first diverging request and position") {
  CHECK(first_divergence({{1, 2}, {3}}, {{1, 2}, {3}}).empty());
  CHECK(first_divergence({{1, 2}, {3, 4}}, {{1, 2}, {3, 5}}) == "request 1 diverges at output position 1: 4 vs 5");
  CHECK(first_divergence({{1, 2}}, {{1}}) == "request 0: 2 vs 1 tokens");
}
