// The sweep's readers: a sweep file (load_sweep, expand_points) and a plan (read_plan), both
// untrusted (a plan travels to cluster nodes). Input starting with '{' is a plan.json; anything
// else is a sweep file whose `workload:` may name base.yaml, a small workload beside it. A sweep
// that loads with at most 16 points is planned, and its plan must read back with the same points
// and keys; a point of it runs at its first rate when the runs are short.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "sim/sweep/sweep_file.h"
#include "sim/sweep/sweep_run.h"
#include "tests/fuzz/fuzz_common.h"

namespace {
constexpr const char* kBase =
    "name: fuzz_base\nmodel: tiny\n"
    "hardware: {name: h, peak_tflops: 1, mem_bandwidth_tbs: 1, step_overhead_us: 100, memory_gb: 24}\n"
    "engine: {policy: continuous, max_num_seqs: 4, max_num_batched_tokens: 64, num_kv_blocks: 64}\n"
    "requests: {count: 8, arrival: {process: poisson, rate: 10}, prompt_len: {dist: uniform, min: 4, max: 40},\n"
    "           output_len: {dist: uniform, min: 1, max: 8}}\n";
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  static const bool base_written = [] {
    tandem_fuzz::write_file(tandem_fuzz::scratch_path("base.yaml"), std::string(kBase));
    return true;
  }();
  (void)base_written;
  try {
    if (!text.empty() && text[0] == '{') {
      const std::string plan = tandem_fuzz::scratch_path("plan/plan.json");
      tandem_fuzz::write_file(plan, text);
      (void)tandem::read_plan(plan);
      return 0;
    }
    const std::string path = tandem_fuzz::scratch_path("sweep.yaml");
    tandem_fuzz::write_file(path, text);
    const tandem::SweepSpec spec = tandem::load_sweep(path);
    size_t points = std::max<size_t>(1, spec.configs.size());
    for (const auto& a : spec.grid) points *= a.values.size();
    if (points > 16) return 0;
    const auto expanded = tandem::expand_points(spec);
    const std::string plan_path = tandem_fuzz::scratch_path("plan/plan.json");
    tandem_fuzz::write_file(plan_path, tandem::plan_json(spec, expanded).dump(1));
    const tandem::SweepPlan back = tandem::read_plan(plan_path);
    if (back.points.size() != expanded.size()) {
      std::fprintf(stderr, "FINDING: the plan read back has %zu points, %zu planned\n", back.points.size(),
                   expanded.size());
      std::abort();
    }
    for (size_t i = 0; i < expanded.size(); ++i)
      if (back.points[i].key != expanded[i].key || back.points[i].workload_yaml != expanded[i].workload_yaml) {
        std::fprintf(stderr, "FINDING: point %zu changed when its plan was read back\n", i);
        std::abort();
      }
    // One short run of the first point (a grid can make the runs long: only small ones run).
    const tandem::Workload w =
        tandem::point_workload(back, back.points[0], spec.capacity ? spec.capacity->lo : spec.rates[0]);
    if (w.requests.count <= 64 && !w.requests.trace) (void)tandem::simulate_point(w, 1, std::nullopt);
  } catch (const tandem::InputError&) {}
  return 0;
}
