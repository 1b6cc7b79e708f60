// Simulator speed: wall time to generate and to simulate a workload, simulated requests per
// wall second, event-loop time per request (all requests, failed at arrival included), per
// finished request and per token processed (prompt and generated tokens the steps ran), and
// peak memory. One workload per process, so the peak RSS is that workload's. Exits 0 with
// "skipped" when a trace file is absent.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>

#include "backend/cost_model.h"
#include "sim/engine/engine.h"

using namespace tandem;

namespace {
// Tokens the steps processed (prefill chunks and decode tokens), counted as the run goes.
struct TokenCounter final : run_observer_i {
  int64_t tokens = 0;
  void on_step(const StepRecord& r) override { tokens += r.plan->num_tokens; }
};
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: bench_sim WORKLOAD.yaml [--header]\n");
    return 2;
  }
  if (argc > 2 && std::string(argv[2]) == "--header")
    fmt::print("{:<26}{:>10}{:>10}{:>10}{:>10}{:>10}{:>12}{:>12}{:>10}{:>14}{:>10}{:>10}\n", "workload", "requests",
               "finished", "steps", "gen_s", "run_s", "us/request", "us/finished", "ns/token", "requests/s", "sim_s",
               "peak_MB");
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
  TokenCounter tokens;
  engine.add_observer(&tokens);
  const Summary s = engine.run();
  // Per finished request and per token: a request that fails at arrival costs next to
  // nothing, so dividing by all requests flatters a workload where many do.
  auto per = [&](double scale, double count) { return count > 0 ? s.wall_s * scale / count : 0.0; };
  fmt::print("{:<26}{:>10}{:>10}{:>10}{:>10.3f}{:>10.3f}{:>12.2f}{:>12.2f}{:>10.1f}{:>14.0f}{:>10.0f}{:>10.0f}\n",
             std::filesystem::path(argv[1]).stem().string(), n, s.finished, s.steps, gen_s, s.wall_s,
             per(1e6, double(n)), per(1e6, double(s.finished)), per(1e9, double(tokens.tokens)), double(n) / s.wall_s,
             s.sim_s, double(peak_rss_kb()) / 1024.0);
  return s.finished + s.failed + s.cancelled == s.total ? 0 : 1;
}
