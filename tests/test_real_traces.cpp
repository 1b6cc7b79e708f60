// The public traces in ../shared/traces: every row parses, counts match the traces'
// README, and a replay accounts for every request. Skips (exit 77) when they are absent.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>

#include "backend/cost_model.h"
#include "sim/engine.h"
#include "sim/traces.h"

using namespace tandem;

namespace {
std::string shared_traces() {
  if (const char* s = std::getenv("TANDEM_TRACES")) return s;
  return std::string(TANDEM_SOURCE_DIR) + "/../shared/traces";
}

Summary replay(const std::string& format, const std::string& path, const std::string& extra = "") {
  const std::string y = "model: llama3-8b\nhardware: h200\nengine: {max_num_batched_tokens: 16384}\nrequests:\n  trace: {format: " +
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
  const std::string y = "model: llama3-8b\nhardware: h200\nrequests:\n  count: 1000\n  arrival: {process: poisson, rate: 5}\n"
                        "  prompt_len: {dist: empirical, path: " + shared_traces() +
                        "/etalon/sharegpt_8k_filtered_stats_llama2_tokenizer.csv}\n"
                        "  output_len: {dist: empirical, path: " + shared_traces() +
                        "/etalon/sharegpt_8k_filtered_stats_llama2_tokenizer.csv}\n";
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
