// Golden suite: feature off vs on, same prompts, greedy decoding, real backend (CPU):
// every request's output tokens identical. Scheduling changes performance, never results.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include "backend/cpu/cpu_executor.h"
#include "sim/engine.h"
#include "tests/golden.h"
#include "tests/test_helpers.h"

namespace tandem::testing {

std::vector<std::vector<Token>> golden_outputs(const std::string& workload, const std::vector<Override>& overrides) {
  Workload w = load_workload(workload, overrides);
  auto exec = cpu::make_cpu_executor(w.model, w.seed, w.engine.resolved_kv_blocks, w.engine.block_size,
                                     w.engine.deterministic, w.engine.tp);
  VirtualClock clock;  // measured step times, no waiting between events: fast and still a real backend
  Engine e(w, generate_requests(w), *exec, clock);
  e.run();
  for (const Request& r : e.requests())
    if (r.status != RequestStatus::Finished || int32_t(e.outputs()[size_t(r.id)].size()) != r.max_output)
      throw std::runtime_error(fmt::format("request {} ended {} with {} tokens", r.id, to_string(r.status),
                                           e.outputs()[size_t(r.id)].size()));
  return e.outputs();
}

std::string first_divergence(const std::vector<std::vector<Token>>& base, const std::vector<std::vector<Token>>& other) {
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

TEST_CASE("golden (stage 1): static vs continuous batching, and continuous at several max_num_seqs and budgets") {
  const std::string wl = source_path("workloads/golden_small.yaml");
  const auto base = golden_outputs(wl, {kNoChunking, {"engine.policy", "static"}, {"engine.max_num_seqs", "8"}});
  size_t tokens = 0;
  for (const auto& o : base) tokens += o.size();
  MESSAGE("baseline: ", base.size(), " requests, ", tokens, " output tokens");
  const std::vector<GoldenRun> runs = {
      {"continuous, 16 seats", {kNoChunking}},
      {"continuous, 2 seats", {kNoChunking, {"engine.max_num_seqs", "2"}}},
      {"continuous, 40 seats, budget 600", {kNoChunking, {"engine.max_num_seqs", "40"}, {"engine.max_num_batched_tokens", "600"}}},
      {"static, 40 seats", {kNoChunking, {"engine.policy", "static"}, {"engine.max_num_seqs", "40"}}},
  };
  for (const auto& run : runs) {
    const std::string diff = first_divergence(base, golden_outputs(wl, run.overrides));
    CHECK_MESSAGE(diff.empty(), run.label, ": ", diff);
  }
}

TEST_CASE("golden x TP (CPU, in-process ranks): static vs continuous token-identical at TP 2 and 4") {
  const std::string wl = source_path("workloads/golden_small.yaml");
  for (const std::string tp : {"2", "4"}) {
    const auto base = golden_outputs(wl, {kNoChunking, {"engine.tp", tp}, {"engine.policy", "static"}, {"engine.max_num_seqs", "8"}});
    const std::string d1 = first_divergence(base, golden_outputs(wl, {kNoChunking, {"engine.tp", tp}}));
    CHECK_MESSAGE(d1.empty(), "tp ", tp, ", continuous 16 seats: ", d1);
    const std::string d2 = first_divergence(base, golden_outputs(wl, {kNoChunking, {"engine.tp", tp}, {"engine.max_num_seqs", "2"}}));
    CHECK_MESSAGE(d2.empty(), "tp ", tp, ", continuous 2 seats: ", d2);
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
  Workload w = load_workload(wl, o);
  auto exec = cpu::make_cpu_executor(w.model, w.seed, w.engine.resolved_kv_blocks, w.engine.block_size,
                                     w.engine.deterministic, w.engine.tp);
  VirtualClock clock;
  Engine e(w, generate_requests(w), *exec, clock);
  ChunkCount count;
  e.add_observer(&count);
  e.run();
  for (const Request& r : e.requests())
    REQUIRE_MESSAGE(r.status == RequestStatus::Finished, "request ", r.id, " ended ", to_string(r.status));
  *cut = count.cut;
  return e.outputs();
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
    std::vector<Case> cases = {{"16", "1", "continuous"}, {"61", "1", "continuous"}, {"512", "1", "continuous"},
                               {"4096", "1", "continuous"}};
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
      MESSAGE("tp ", tp, ", budget ", c.budget, ", partials ", c.partials, ", ", c.policy, ": ", cut, " prompt chunks that did not sample");
      // Budget 4096 exceeds every prompt (max 500), so prompts are cut only when several arrive at once.
      if (c.budget != "4096") CHECK_MESSAGE(cut > 0, "budget ", c.budget, ": no prompt was cut");
    }
  }
}

TEST_CASE("the comparison names the first diverging request and position") {
  CHECK(first_divergence({{1, 2}, {3}}, {{1, 2}, {3}}).empty());
  CHECK(first_divergence({{1, 2}, {3, 4}}, {{1, 2}, {3, 5}}) == "request 1 diverges at output position 1: 4 vs 5");
  CHECK(first_divergence({{1, 2}}, {{1}}) == "request 0: 2 vs 1 tokens");
}
