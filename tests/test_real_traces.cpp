// The public traces in ../shared/traces: every row parses, counts match the traces'
// README, and a replay accounts for every request. Skips (exit 77) when they are absent.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <unordered_set>

#include "backend/cost_model.h"
#include "core/rng.h"
#include "sim/engine/engine.h"
#include "sim/workload/prefix_bound.h"
#include "sim/workload/traces.h"

using namespace tandem;

namespace {
std::string shared_traces() {
  if (const char* s = std::getenv("TANDEM_TRACES")) return s;
  return std::string(TANDEM_SOURCE_DIR) + "/../shared/traces";
}

Summary replay(const std::string& format, const std::string& path, const std::string& extra = "") {
  const std::string y =
      "model: llama3-8b\nhardware: h200\nengine: {max_num_batched_tokens: 16384}\nrequests:\n  trace: {format: " +
      format + ", path: " + path + extra + "}\n";
  Workload w = parse_workload(y, "real_trace.yaml");
  SimExecutor exec(std::make_unique<AnalyticalCostModel>(w.model, w.hardware));
  VirtualClock clock;
  Engine e(w, generate_requests(w), exec, clock);
  Summary s = e.run();
  CHECK(s.finished + s.failed + s.cancelled == s.total);
  return s;
}
}  // namespace

TEST_CASE("azure 2023 conv and code: all rows, replayed") {
  const std::string dir = shared_traces() + "/azure_llm_2023/";
  TraceSpec t;
  std::vector<int64_t> pool;
  t.path = dir + "AzureLLMInferenceTrace_conv.csv";
  auto rows = read_trace(t, pool);
  CHECK(rows.size() == 19366);
  CHECK(rows.back().t_s == doctest::Approx(3501.7).epsilon(1e-4));
  t.path = dir + "AzureLLMInferenceTrace_code.csv";  // no trailing newline after the last row
  rows = read_trace(t, pool);
  CHECK(rows.size() == 8819);
  CHECK(rows.back().t_s == doctest::Approx(3435.9).epsilon(1e-4));
  const Summary s = replay("azure", dir + "AzureLLMInferenceTrace_conv.csv");
  CHECK(s.total == 19366);
  CHECK(s.finished > 19300);  // a few prompts exceed max_model_len 8192 and fail with that reason
  CHECK(s.failed == s.failed_by_reason.at("exceeds_max_model_len"));
}

TEST_CASE("mooncake conversation: hash ids per 512 tokens, a window replayed") {
  TraceSpec t;
  t.format = TraceSpec::Format::Mooncake;
  t.path = shared_traces() + "/mooncake/conversation_trace.jsonl";
  std::vector<int64_t> pool;
  auto rows = read_trace(t, pool);
  CHECK(rows.size() == 12031);
  for (const auto& r : rows) REQUIRE(int64_t(r.hash_count) == (r.prompt_len + 511) / 512);
  const Summary s = replay("mooncake", t.path, ", duration_s: 300");
  CHECK(s.total > 500);
  CHECK(s.finished > 0);
}

// Prefix caching on the whole Mooncake hour, simulated: the default KV cache of the preset
// (llama3.1-8b, so that the 126k-token prompts fit max_model_len; H200) and one of 8,192 blocks
// (131k tokens: every request still fits, about ten at a time, so cached blocks are evicted).
// Both hit at most the ideal of sim/workload/prefix_bound.h, which is cross-checked against the same
// ideal counted on the trace's own 512-token hash ids.
TEST_CASE("mooncake conversation: the whole hour with prefix caching, below the ideal") {
  const std::string path = shared_traces() + "/mooncake/conversation_trace.jsonl";
  const auto workload = [&](const std::string& kv) {
    return parse_workload(
        "model: llama3.1-8b\nhardware: h200\nengine: {max_num_batched_tokens: 16384, "
        "enable_prefix_caching: true" +
            kv + "}\nrequests:\n  trace: {format: mooncake, path: " + path + "}\n",
        "mooncake_prefix.yaml");
  };
  using clk = std::chrono::steady_clock;
  const auto secs = [](clk::time_point a) { return std::chrono::duration<double>(clk::now() - a).count(); };

  const Workload wu = workload(""), wb = workload(", num_kv_blocks: 8192");
  REQUIRE(wb.engine.resolved_kv_blocks == 8192);
  REQUIRE(wu.engine.resolved_kv_blocks > 8192);
  auto t0 = clk::now();
  const RequestSet rs = generate_requests(wu);
  const PrefixBound b = prefix_bound(wu, rs);  // the bound depends on the prompts, not on the cache size
  const double bound_s = secs(t0);
  REQUIRE(b.requests == 12031);

  // The same ideal on the trace's 512-token hash ids: a request's leading ids whose whole id
  // prefix an earlier request had (ids name token blocks, so a chain of ids is a chain of
  // blocks), in tokens capped at prompt_len - 1. The 16-token bound can only be lower: an id
  // an earlier request had as its partial last block counts whole here, and the cap rounds
  // down to a block there.
  int64_t ideal512_tokens = 0, ideal512_anywhere_tokens = 0, ideal512_requests = 0;
  {
    std::unordered_set<uint64_t> prefixes;  // hash of ids[0..i], for every earlier request and i
    std::unordered_set<int64_t> ids;        // ids seen anywhere (the looser count)
    for (const Request& r : rs.requests) {
      uint64_t h = 0x6d6f6f6eULL;
      size_t lead = 0, lead_anywhere = 0;
      bool chained = true, anywhere = true;
      std::vector<uint64_t> mine;
      for (uint32_t i = 0; i < r.hash_ids_count; ++i) {
        const int64_t id = rs.hash_ids[r.hash_ids_begin + i];
        h = hash_combine(h, uint64_t(id));
        mine.push_back(h);
        chained = chained && prefixes.count(h);
        anywhere = anywhere && ids.count(id);
        lead += chained;
        lead_anywhere += anywhere;
      }
      for (uint64_t x : mine) prefixes.insert(x);
      for (uint32_t i = 0; i < r.hash_ids_count; ++i) ids.insert(rs.hash_ids[r.hash_ids_begin + i]);
      const int64_t cap = r.prompt_len - 1;
      ideal512_tokens += std::min<int64_t>(int64_t(lead) * rs.hash_block_size, cap);
      ideal512_anywhere_tokens += std::min<int64_t>(int64_t(lead_anywhere) * rs.hash_block_size, cap);
      ideal512_requests += lead > 0;
    }
  }
  CHECK(b.hit_tokens <= ideal512_tokens);
  CHECK(double(b.hit_tokens) >= 0.97 * double(ideal512_tokens));
  CHECK(b.requests_hit == ideal512_requests);

  const auto run = [&](const Workload& w, double* wall_s) {
    const auto t = clk::now();
    SimExecutor exec(std::make_unique<AnalyticalCostModel>(w.model, w.hardware));
    VirtualClock clock;
    Engine e(w, generate_requests(w), exec, clock);
    const Summary s = e.run();
    *wall_s = secs(t);
    CHECK(s.total == 12031);
    CHECK(s.finished + s.failed + s.cancelled == s.total);  // nothing lost
    CHECK(s.failed == 0);
    int64_t admitted_bound_blocks = 0;
    for (const Request& r : e.requests()) {
      REQUIRE(r.num_cached_tokens <= b.hit_blocks_by_request[size_t(r.id)] * w.engine.block_size);
      if (r.first_scheduled != kNever) admitted_bound_blocks += b.hit_blocks_by_request[size_t(r.id)];
    }
    CHECK(s.prefix_queried_tokens == b.queried_tokens);  // every request admitted: same denominator
    CHECK(admitted_bound_blocks == b.hit_blocks);
    return s;
  };
  double wall_u = 0, wall_b = 0;
  const Summary su = run(wu, &wall_u), sb = run(wb, &wall_b);
  CHECK(su.prefix_hit_rate <= b.hit_rate());
  CHECK(sb.prefix_hit_rate <= b.hit_rate());
  CHECK(sb.prefix_hit_rate > 0);
  CHECK(sb.prefix_hit_rate < su.prefix_hit_rate);
  CHECK(sb.prefix_evictions > 0);
  MESSAGE(fmt::format(
      "mooncake hour, block size {}: ideal {:.4f} of prompt tokens ({:.4f} of full blocks, {} of {} requests); "
      "on the 512-token hash ids {:.4f} (ids seen anywhere before: {:.4f}); bound + generate {:.2f} s",
      b.block_size, b.hit_rate(), b.block_hit_rate(), b.requests_hit, b.requests,
      double(ideal512_tokens) / double(b.queried_tokens), double(ideal512_anywhere_tokens) / double(b.queried_tokens),
      bound_s));
  for (const auto& [name, s, w, wall] : {std::tuple{"default", &su, &wu, wall_u}, std::tuple{"8192", &sb, &wb, wall_b}})
    MESSAGE(
        fmt::format("  kv {} blocks ({}): hit rate {:.4f} (blocks {:.4f}), {} of {} requests hit, {} evictions, "
                    "finished {}, simulated {:.0f} s, wall {:.2f} s (loop {:.2f} s)",
                    w->engine.resolved_kv_blocks, name, s->prefix_hit_rate, s->prefix_block_hit_rate, s->prefix_hits,
                    s->prefix_queries, s->prefix_evictions, s->finished, s->sim_s, wall, s->wall_s));
}

TEST_CASE("vidur copies match the azure originals") {
  TraceSpec a, v;
  a.path = shared_traces() + "/azure_llm_2023/AzureLLMInferenceTrace_conv.csv";
  v.format = TraceSpec::Format::Vidur;
  v.path = shared_traces() + "/vidur/splitwise_conv.csv";
  std::vector<int64_t> pool;
  auto ra = read_trace(a, pool), rv = read_trace(v, pool);
  REQUIRE(ra.size() == rv.size());
  for (size_t i = 0; i < ra.size(); i += 97) {
    CHECK(ra[i].prompt_len == rv[i].prompt_len);
    CHECK(ra[i].t_s == doctest::Approx(rv[i].t_s).epsilon(1e-6));
  }
}

TEST_CASE("sharegpt lengths as an empirical distribution") {
  const std::string y =
      "model: llama3-8b\nhardware: h200\nrequests:\n  count: 1000\n  arrival: {process: poisson, rate: 5}\n"
      "  prompt_len: {dist: empirical, path: " +
      shared_traces() +
      "/etalon/sharegpt_8k_filtered_stats_llama2_tokenizer.csv}\n"
      "  output_len: {dist: empirical, path: " +
      shared_traces() + "/etalon/sharegpt_8k_filtered_stats_llama2_tokenizer.csv}\n";
  RequestSet s = generate_requests(parse_workload(y, "w.yaml"));
  double sum = 0;
  for (const Request& r : s.requests) sum += r.prompt_len;
  CHECK(sum / 1000 == doctest::Approx(2340).epsilon(0.1));
}

int main(int argc, char** argv) {
  if (!std::filesystem::exists(shared_traces() + "/azure_llm_2023/AzureLLMInferenceTrace_conv.csv")) {
    std::printf("SKIP: public traces not found at %s (set TANDEM_TRACES)\n", shared_traces().c_str());
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
