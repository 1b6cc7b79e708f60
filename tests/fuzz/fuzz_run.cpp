// The run path (issue "Hardening after stage 3"): a whole workload through parse, request
// generation, the engine in simulated time and the outputs. Input: a workload YAML with
// "#set KEY=VALUE" lines, as fuzz_workload. Capped so that one execution stays in
// milliseconds: at most 64 requests (count and trace limit), and a skip when the servable
// requests' tokens are too many to simulate quickly. Checked, beyond "no crash, no sanitizer
// report": every step keeps held + reserved <= capacity, time never goes back, every request
// ends finished, cancelled or failed with a reason, and the engine's own end-of-run checks
// (no lost event, no leaked block) hold. A run that stops at the simulator's time range
// (std::runtime_error naming it) is an expected outcome, like bad input.
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cost_model.h"
#include "sim/engine/clock.h"
#include "sim/workload/config.h"
#include "sim/engine/engine.h"
#include "sim/outputs/outputs.h"
#include "tests/fuzz/fuzz_common.h"

namespace {
constexpr int64_t kMaxRequests = 64;
constexpr int64_t kMaxPromptTokens = 1'000'000;  // summed over requests that fit max_model_len
constexpr int64_t kMaxOutputTokens = 20'000;

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "FINDING: %s\n", what.c_str());
  std::abort();
}

struct Invariants : tandem::run_observer_i {
  tandem::Time last_start = -1;
  void on_step(const tandem::StepRecord& r) override {
    if (r.kv_used + r.kv_reserved > r.kv_capacity) finding("held + reserved blocks exceed the KV capacity");
    if (r.start < last_start) finding("a step starts before the one before it");
    if (r.plan->num_tokens <= 0 || r.plan->seqs.empty()) finding("an empty step ran");
    last_start = r.start;
  }
  void on_request_done(const tandem::Request& r) override {
    if (r.alive()) finding("a request reported done is still alive");
    if (r.status == tandem::RequestStatus::Failed && r.fail_reason == tandem::FailReason::None)
      finding("a request failed without a reason");
  }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::vector<tandem::Override> overrides = tandem_fuzz::set_lines(text);
  const std::string path = std::string(TANDEM_SOURCE_DIR) + "/workloads/fuzz-input.yaml";
  try {
    tandem::Workload w = tandem::parse_workload(text, path, overrides);
    if (w.requests.trace) {
      if (w.requests.trace->limit == 0 || w.requests.trace->limit > kMaxRequests)
        w.requests.trace->limit = kMaxRequests;
    } else if (w.requests.count > kMaxRequests) {
      w.requests.count = kMaxRequests;
    }
    tandem::RequestSet rs = tandem::generate_requests(w);
    int64_t prompt = 0, output = 0;
    for (const tandem::Request& r : rs.requests) {
      if (int64_t{r.prompt_len} + r.max_output > w.model.max_model_len) continue;  // fails at arrival: no work
      prompt += r.prompt_len;
      output += r.max_output;
    }
    if (prompt > kMaxPromptTokens || output > kMaxOutputTokens) return 0;
    tandem::VirtualClock clock;
    tandem::SimExecutor exec(tandem::make_cost_model(w.model, w.hardware, w.engine.tp));
    tandem::Engine engine(w, std::move(rs), exec, clock);
    Invariants inv;
    engine.add_observer(&inv);
    tandem::RunOutputs outputs(tandem_fuzz::scratch_path("run"), tandem::TraceDetail::Requests);
    engine.add_observer(&outputs);
    tandem::Summary s;
    try {
      s = engine.run();
    } catch (const std::runtime_error& e) {
      const std::string msg = e.what();
      if (msg.find("time range") == std::string::npos) finding("the engine failed: " + msg);
      return 0;  // stopped at the simulator's time range: an expected outcome (exit 1, named)
    }
    if (s.finished + s.failed + s.cancelled != s.total) finding("requests neither finished, failed nor cancelled");
    for (const tandem::Request& r : engine.requests())
      if (r.alive()) finding("a request is alive at the end of the run");
    outputs.finish(engine, s, w);
    std::ostringstream table;
    tandem::print_summary(table, s);
  } catch (const tandem::InputError&) {}
  return 0;
}
