#include "sim/sweep/sweep_vllm.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "sim/outputs/outputs_vllm.h"

namespace tandem {

namespace fs = std::filesystem;

namespace {

constexpr const char* kMarker = "WRITTEN-BY-TANDEM-SWEEP";

// A grid value as vLLM's records hold their overrides: a number where it reads as one.
nlohmann::json param_value(const std::string& v) {
  char* end = nullptr;
  const long long i = std::strtoll(v.c_str(), &end, 10);
  if (!v.empty() && end && *end == '\0') return int64_t(i);
  const double d = std::strtod(v.c_str(), &end);
  if (!v.empty() && end && *end == '\0') return d;
  if (v == "true" || v == "false") return v == "true";
  return v;
}

// vLLM's sanitize_filename, so that the folder names read as its own.
std::string folder_name(std::string s) {
  for (size_t at; (at = s.find("..")) != std::string::npos;) s.replace(at, 2, "__");
  for (char& c : s)
    if (c == '/') c = '_';
  return s;
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out.flush()) throw std::runtime_error(fmt::format("{}: cannot write", path.string()));
}

}  // namespace

nlohmann::json vllm_sweep_record(const nlohmann::json& point, const nlohmann::json& run, int64_t run_number) {
  const nlohmann::json& m = run["metrics"];
  const auto metric = [&](const std::string& k) { return m.contains(k) ? m[k] : nlohmann::json(); };
  nlohmann::json r = nlohmann::json::object();
  r["request_rate"] = run.contains("rate") ? run["rate"] : nlohmann::json();
  r["max_concurrency"] = nullptr;  // tandem's arrivals are open-loop, as vLLM's without --max-concurrency
  r["duration"] = metric("makespan_s");
  const int64_t total = m.value("requests.total", int64_t(0)), finished = m.value("requests.finished", int64_t(0));
  r["completed"] = finished;
  r["failed"] = total - finished;
  r["request_throughput"] = metric("throughput.requests_per_s");
  r["output_throughput"] = metric("throughput.output_tokens_per_s");
  r["total_token_throughput"] = metric("throughput.total_tokens_per_s");
  for (const auto& [vllm, ours] :
       {std::pair{"ttft", "ttft_ms"}, {"tpot", "tpot_ms"}, {"itl", "itl_ms"}, {"e2el", "e2e_ms"}})
    for (const auto& [stat, key] : {std::pair{"mean", "mean"}, {"median", "p50"}, {"p90", "p90"}, {"p99", "p99"}})
      r[fmt::format("{}_{}_ms", stat, vllm)] = metric(fmt::format("{}.{}", ours, key));
  r["run_number"] = run_number;
  // The GPUs: vLLM's plot_pareto reads tensor_parallel_size x data_parallel_size unless told
  // --gpu-count-var; both only where they multiply to the layout's GPUs (vllm_gpu_keys).
  const nlohmann::json& layout =
      point.contains("layout") && point["layout"].is_object() ? point["layout"] : nlohmann::json::object();
  const VllmGpuKeys gpus = vllm_gpu_keys(layout);
  r["num_gpus"] = gpus.num_gpus ? nlohmann::json(*gpus.num_gpus) : nlohmann::json(nullptr);
  if (gpus.tensor_parallel_size && gpus.data_parallel_size) {
    r["tensor_parallel_size"] = *gpus.tensor_parallel_size;
    r["data_parallel_size"] = *gpus.data_parallel_size;
  }
  // The point: its parameters under their tandem keys (vLLM's records carry their overrides so),
  // its name, the SLO verdict and the offered rate.
  for (const auto& kv : point["params"]) r[kv[0].get<std::string>()] = param_value(kv[1].get<std::string>());
  r["tandem_point"] = point["name"];
  // Which first token its TTFT counts (1P1D: the prefill or the decode instance's).
  if (layout.contains("first_token_from")) r["tandem_first_token_from"] = layout["first_token_from"];
  if (run.contains("meets_slo")) r["tandem_meets_slo"] = run["meets_slo"];
  if (run.contains("offered_rate")) r["tandem_offered_rate"] = run["offered_rate"];
  return r;
}

int64_t write_vllm_sweep_layout(const std::map<int64_t, nlohmann::json>& results, const std::string& dir) {
  const fs::path root = fs::path(dir) / "vllm";
  if (fs::exists(root)) {
    if (!fs::exists(root / kMarker))
      throw std::runtime_error(
          fmt::format("{}: exists and was not written by tandem sweep (no {} file): not replaced; move it away",
                      root.string(), kMarker));
    fs::remove_all(root);
  }
  fs::create_directories(root);
  write_text(root / kMarker,
             "The sweep's runs in vLLM's sweep layout (vllm bench sweep plot / plot_pareto read it), rewritten by "
             "each tandem sweep collect.\n");
  int64_t written = 0;
  for (const auto& [index, point] : results) {
    if (point.contains("error") || !point.contains("runs")) continue;
    int64_t n = 0;
    for (const auto& run : point["runs"]) {
      const std::string bench = run.contains("rate") && run["rate"].is_number()
                                    ? fmt::format("-BENCH-request_rate={}", run["rate"].get<double>())
                                    : fmt::format("-BENCH-run={}", n);
      fs::path folder = root / folder_name("SERVE-" + point["name"].get<std::string>() + bench);
      if (fs::exists(folder)) folder += fmt::format("-run={}", n);  // a rate run twice keeps both
      fs::create_directories(folder);
      nlohmann::json list = nlohmann::json::array({vllm_sweep_record(point, run, 0)});
      write_text(folder / "summary.json", list.dump(4) + "\n");
      ++n;
      ++written;
    }
  }
  return written;
}

}  // namespace tandem
