// The ideal prefix hit count (sim/workload/prefix_bound.h): equal to hand-computed values on small
// workloads, and never below what a run hits, request by request.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "backend/cost_model.h"
#include "sim/engine/engine.h"
#include "sim/workload/prefix_bound.h"
#include "tests/test_helpers.h"

using namespace tandem;

namespace {
// Runs the workload and checks the run against its bound: per request, and in total.
Summary run_against_bound(const Workload& w, const PrefixBound& b) {
  SimExecutor exec(std::make_unique<AnalyticalCostModel>(w.model, w.hardware));
  VirtualClock clock;
  Engine e(w, generate_requests(w), exec, clock);
  const Summary s = e.run();
  CHECK(s.finished + s.failed + s.cancelled == s.total);
  int64_t admitted_tokens = 0, admitted_bound_blocks = 0;
  for (const Request& r : e.requests()) {
    REQUIRE(r.num_cached_tokens % w.engine.block_size == 0);
    REQUIRE(r.num_cached_tokens / w.engine.block_size <= b.hit_blocks_by_request[size_t(r.id)]);
    if (r.first_scheduled == kNever) continue;
    admitted_tokens += r.prompt_len;
    admitted_bound_blocks += b.hit_blocks_by_request[size_t(r.id)];
  }
  CHECK(s.prefix_hit_tokens <= b.hit_tokens);
  CHECK(s.prefix_hit_blocks <= b.hit_blocks);
  // Rates on the same requests (the bound's own rate also counts requests the run never admitted).
  CHECK(admitted_tokens == s.prefix_queried_tokens);
  CHECK(s.prefix_hit_rate <= double(admitted_bound_blocks * w.engine.block_size) / double(admitted_tokens) + 1e-12);
  return s;
}

const char* kModel =
    "model: {layers: 4, hidden: 512, heads: 8, kv_heads: 2, ffn: 1024, vocab: 1000, max_model_len: 4096}\n"
    "hardware: {peak_tflops: 100, mem_bandwidth_tbs: 1, step_overhead_us: 50, memory_gb: 10}\n";
}  // namespace

TEST_CASE("prefix bound: one group, every prompt opens with the same 40 tokens") {
  // 100-token prompts, 16-token blocks: 6 full blocks each; the shared 40 tokens cover blocks 0
  // and 1 whole (block 2 mixes prefix and own tokens). The first request hits nothing, each of
  // the other 9 hits 2 blocks.
  const Workload w =
      parse_workload(std::string(kModel) +
                         "engine: {block_size: 16, num_kv_blocks: 4096}\n"
                         "requests:\n  count: 10\n  arrival: {process: constant, rate: 1}\n"
                         "  prompt_len: {dist: fixed, value: 100}\n  output_len: {dist: fixed, value: 4}\n"
                         "  shared_prefix: {groups: 1, prefix_len: {dist: fixed, value: 40}}\n",
                     "w.yaml");
  const PrefixBound b = prefix_bound(w, generate_requests(w));
  CHECK(b.requests == 10);
  CHECK(b.requests_hit == 9);
  CHECK(b.hit_blocks == 18);
  CHECK(b.hit_tokens == 18 * 16);
  CHECK(b.queried_tokens == 1000);
  CHECK(b.queried_blocks == 60);
  CHECK(b.hit_blocks_by_request[0] == 0);
  for (size_t i = 1; i < 10; ++i) CHECK(b.hit_blocks_by_request[i] == 2);
  // Requests arrive a second apart, long after the previous one finished: the run hits it all.
  const Summary s = run_against_bound(w, b);
  CHECK(s.prefix_hit_tokens == b.hit_tokens);
  CHECK(s.prefix_hit_rate == doctest::Approx(b.hit_rate()));
}

TEST_CASE("prefix bound: a prompt shared whole still computes its last block") {
  // 64-token prompts, all the same: 4 full blocks, of which at most (64 - 1) / 16 = 3 can hit.
  const Workload w =
      parse_workload(std::string(kModel) +
                         "engine: {block_size: 16, num_kv_blocks: 4096}\n"
                         "requests:\n  count: 5\n  arrival: {process: constant, rate: 1}\n"
                         "  prompt_len: {dist: fixed, value: 64}\n  output_len: {dist: fixed, value: 4}\n"
                         "  shared_prefix: {groups: 1, prefix_len: {dist: fixed, value: 64}}\n",
                     "w.yaml");
  const PrefixBound b = prefix_bound(w, generate_requests(w));
  CHECK(b.hit_blocks == 4 * 3);
  CHECK(b.queried_blocks == 5 * 4);
  CHECK(b.requests_hit == 4);
  const Summary s = run_against_bound(w, b);
  CHECK(s.prefix_hit_tokens == b.hit_tokens);
}

TEST_CASE("prefix bound: several groups, against the group each request drew") {
  // Groups and membership are drawn from the seed; the hand count uses only the drawn group:
  // the first member of a group hits nothing, every later member its 2 whole prefix blocks;
  // requests outside any group hit nothing.
  const Workload w =
      parse_workload(std::string(kModel) +
                         "seed: 11\nengine: {block_size: 16, num_kv_blocks: 4096}\n"
                         "requests:\n  count: 300\n  arrival: {process: poisson, rate: 50}\n"
                         "  prompt_len: {dist: fixed, value: 100}\n  output_len: {dist: uniform, min: 1, max: 64}\n"
                         "  shared_prefix: {groups: 5, prefix_len: {dist: fixed, value: 40}, fraction: 0.7}\n",
                     "w.yaml");
  const RequestSet rs = generate_requests(w);
  std::set<int32_t> seen;
  int64_t expect = 0, in_groups = 0;
  for (const Request& r : rs.requests) {
    if (r.prefix_group < 0) continue;
    ++in_groups;
    if (!seen.insert(r.prefix_group).second) expect += 2;
  }
  REQUIRE(in_groups > 150);
  REQUIRE(seen.size() == 5);
  const PrefixBound b = prefix_bound(w, rs);
  CHECK(b.hit_blocks == expect);
  CHECK(b.requests_hit == in_groups - 5);
  // Poisson at 50/s: some members arrive while their group's first prompt is still computing.
  run_against_bound(w, b);
  // A cache too small to keep much: still never above the bound.
  run_against_bound(
      parse_workload(std::string(kModel) +
                         "seed: 11\nengine: {block_size: 16, num_kv_blocks: 40, max_num_seqs: 4}\n"
                         "requests:\n  count: 300\n  arrival: {process: poisson, rate: 50}\n"
                         "  prompt_len: {dist: fixed, value: 100}\n  output_len: {dist: uniform, min: 1, max: 64}\n"
                         "  shared_prefix: {groups: 5, prefix_len: {dist: fixed, value: 40}, fraction: 0.7}\n"
                         "  cancel: {fraction: 0.2, after_s: {dist: uniform, min: 0, max: 0.5}}\n",
                     "w.yaml"),
      b);
}

TEST_CASE("prefix bound: mooncake hash ids decide the shared blocks") {
  // hash_block_size 32 (two 16-token blocks per id). B repeats A's first two ids: 64 tokens,
  // 4 blocks. C starts with another id: nothing. D is A's first 20 tokens: 1 full block, and
  // (20 - 1) / 16 = 1 may hit.
  const auto path = std::filesystem::temp_directory_path() / fmt::format("tandem_prefix_bound_{}.jsonl", ::getpid());
  {
    std::ofstream f(path);
    f << R"({"timestamp": 0, "input_length": 96, "output_length": 2, "hash_ids": [1, 2, 3]})"
      << "\n"
      << R"({"timestamp": 10, "input_length": 90, "output_length": 2, "hash_ids": [1, 2, 4]})"
      << "\n"
      << R"({"timestamp": 20, "input_length": 40, "output_length": 2, "hash_ids": [5, 2]})"
      << "\n"
      << R"({"timestamp": 30, "input_length": 20, "output_length": 2, "hash_ids": [1]})"
      << "\n";
  }
  const Workload w =
      parse_workload(std::string(kModel) + "engine: {block_size: 16, num_kv_blocks: 4096}\n" +
                         "requests:\n  trace: {format: mooncake, hash_block_size: 32, path: " + path.string() + "}\n",
                     "w.yaml");
  const PrefixBound b = prefix_bound(w, generate_requests(w));
  std::filesystem::remove(path);
  REQUIRE(b.hit_blocks_by_request.size() == 4);
  CHECK(b.hit_blocks_by_request[0] == 0);
  CHECK(b.hit_blocks_by_request[1] == 4);
  CHECK(b.hit_blocks_by_request[2] == 0);
  CHECK(b.hit_blocks_by_request[3] == 1);
  CHECK(b.queried_blocks == 6 + 5 + 2 + 1);
}

TEST_CASE("prefix bound: the stage 3 shared-prefix workload, run below its bound") {
  const Workload w = load_workload(testing::source_path("workloads/stage3_shared_prefix.yaml"));
  const PrefixBound b = prefix_bound(w, generate_requests(w));
  const Summary s = run_against_bound(w, b);
  MESSAGE(fmt::format("stage3_shared_prefix: run hit rate {:.4f}, bound {:.4f} ({} of {} requests could hit)",
                      s.prefix_hit_rate, b.hit_rate(), b.requests_hit, b.requests));
  CHECK(s.prefix_hit_rate > 0.5 * b.hit_rate());
}
