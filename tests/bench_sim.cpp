// Simulator speed: wall time to generate and to simulate a workload, simulated requests per
// wall second, event-loop µs per request and peak memory. One workload per process, so the
// peak RSS is that workload's. Exits 0 with "skipped" when a trace file is absent.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>

#include "backend/cost_model.h"
#include "sim/engine.h"

using namespace tandem;

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: bench_sim WORKLOAD.yaml [--header]\n");
    return 2;
  }
  if (argc > 2 && std::string(argv[2]) == "--header")
    fmt::print("{:<26}{:>10}{:>10}{:>10}{:>10}{:>12}{:>14}{:>10}{:>10}\n", "workload", "requests", "steps", "gen_s", "run_s",
               "us/request", "requests/s", "sim_s", "peak_MB");
  const auto t0 = std::chrono::steady_clock::now();
  Workload w;
  RequestSet rs;
  try {
    w = load_workload(argv[1]);
    rs = generate_requests(w);
  } catch (const InputError& e) {
    if (std::string(e.what()).find("cannot open") != std::string::npos) {
      fmt::print("{:<26} skipped: {}\n", std::filesystem::path(argv[1]).stem().string(), e.what());
      return 0;
    }
    fmt::print(stderr, "{}\n", e.what());
    return 2;
  }
  const double gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  SimExecutor exec(std::make_unique<AnalyticalCostModel>(w.model, w.hardware));
  VirtualClock clock;
  const size_t n = rs.requests.size();
  Engine engine(w, std::move(rs), exec, clock);
  const Summary s = engine.run();
  fmt::print("{:<26}{:>10}{:>10}{:>10.3f}{:>10.3f}{:>12.2f}{:>14.0f}{:>10.0f}{:>10.0f}\n",
             std::filesystem::path(argv[1]).stem().string(), n, s.steps, gen_s, s.wall_s, s.wall_s * 1e6 / double(n),
             double(n) / s.wall_s, s.sim_s, double(peak_rss_kb()) / 1024.0);
  return s.finished + s.failed + s.cancelled == s.total ? 0 : 1;
}
