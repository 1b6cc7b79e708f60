// Scheduler microbenchmark: µs per schedule() call on a fixed fixture (see README):
// 4,096 blocks of 256 tokens, no prefix caching, waiting prompts of 16 tokens, running
// requests with 1 prompt + 1 generated token, 512-token output limit, token budget 16,384,
// max_num_seqs = running + waiting (so every case schedules everybody). A fresh fixture per
// call; only the schedule() call is timed; median over rounds.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <vector>

#include "policies/scheduler.h"

using namespace tandem;

namespace {
double one_call_us(int running, int waiting) {
  const int n = running + waiting;
  std::vector<Request> reqs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    reqs[size_t(i)].id = i;
    reqs[size_t(i)].prompt_len = i < running ? 1 : 16;
    reqs[size_t(i)].max_output = 512;
  }
  KvCache kv(4096, 256, -1, n);
  Scheduler s({BatchingPolicy::Continuous, std::max(1, n), 16384, 1 << 20}, reqs, kv);
  for (int i = 0; i < running; ++i) s.add_request(i, 0);
  if (running > 0) {  // prefill the running ones: 1 prompt token computed, 1 token generated
    s.schedule(0);
    s.complete_step(1);
  }
  for (int i = running; i < n; ++i) s.add_request(i, 1);
  const auto t0 = std::chrono::steady_clock::now();
  const StepPlan& p = s.schedule(2);
  const auto t1 = std::chrono::steady_clock::now();
  if (int(p.seqs.size()) != n) throw std::runtime_error(fmt::format("fixture broken: planned {} of {}", p.seqs.size(), n));
  return std::chrono::duration<double, std::micro>(t1 - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 2001;
  const std::pair<int, int> cases[] = {{0, 32}, {1, 1}, {32, 16}, {128, 32}, {512, 64}, {512, 0}, {0, 64}, {1024, 128}};
  fmt::print("scheduler microbenchmark: median of {} rounds, fresh fixture each\n", rounds);
  fmt::print("{:>8}{:>8}{:>12}{:>12}{:>14}\n", "running", "waiting", "median_us", "p90_us", "ns/request");
  for (auto [r, w] : cases) {
    std::vector<double> t;
    for (int i = 0; i < rounds; ++i) t.push_back(one_call_us(r, w));
    std::sort(t.begin(), t.end());
    const double med = t[t.size() / 2], p90 = t[t.size() * 9 / 10];
    fmt::print("{:>8}{:>8}{:>12.2f}{:>12.2f}{:>14.1f}\n", r, w, med, p90, med * 1e3 / (r + w));
  }
  // Not measured here: figures for InfiniLM's Python scheduler on the same fixture, quoted
  // from the stage 1 scheduler issue (another machine, another run; see
  // reports/stage1-continuous-batching/report.md). A later side-by-side run found InfiniLM
  // 1.5-2.5x faster than these quotes, so they are no baseline for the column above.
  fmt::print("\nquoted, not measured here: InfiniLM (Python) µs per call from the stage 1 scheduler issue,\n"
             "another machine; a side-by-side run found InfiniLM 1.5-2.5x faster than these quotes\n");
  fmt::print("{:>8}{:>8}{:>16}{:>22}\n", "running", "waiting", "quoted_us", "quoted_sum_once_us");
  const struct {
    int running, waiting;
    double us, summed_us;
  } quoted[] = {{0, 32, 200, 196}, {1, 1, 15, 16}, {32, 16, 992, 238}, {128, 32, 6900, 484}, {512, 64, 48967, 2205}};
  for (const auto& q : quoted) fmt::print("{:>8}{:>8}{:>16.0f}{:>22.0f}\n", q.running, q.waiting, q.us, q.summed_us);
  return 0;
}
