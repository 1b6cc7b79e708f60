#include "sim/calibrate.h"

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <unistd.h>

#include <Eigen/Dense>
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <fstream>
#include <iostream>

#include "backend/cpu/kernels.h"
#include "backend/cpu/llama.h"
#include "backend/cpu/cpu_executor.h"
#include "sim/config.h"
#include "sim/engine.h"
#include "sim/rng.h"

namespace tandem {

namespace {
constexpr int kFeatures = 6;  // 1, tokens, seqs, attention pairs, context tokens, samples

Eigen::Matrix<double, 1, kFeatures> row_of(const PlanFeatures& f) {
  Eigen::Matrix<double, 1, kFeatures> r;
  r << 1.0, f.tokens, f.seqs, f.attn_pairs, f.context_tokens, f.samples;
  return r;
}


struct GridPlan {
  std::vector<std::pair<int32_t, int32_t>> seqs;  // (context before, new tokens)
  bool samples = true;
};

std::vector<GridPlan> grid(int32_t max_len, bool quick) {
  std::vector<GridPlan> g;
  for (int32_t n : {16, 64, 128, 256, 512, 1024, 2048})
    if (n <= max_len) g.push_back({{{0, n}}, true});
  for (int32_t c0 : {256, 1024})
    for (int32_t n : {64, 256})
      if (c0 + n <= max_len) g.push_back({{{c0, n}}, false});  // a chunk over a cached prefix, no sample
  g.push_back({{{0, 64}, {0, 64}, {0, 64}, {0, 64}}, true});
  g.push_back({std::vector<std::pair<int32_t, int32_t>>(8, {0, 32}), true});
  for (int32_t s : {1, 2, 4, 8, 16, 32, 64})
    for (int32_t ctx : {16, 128, 512, 1024}) {
      if (quick && (s > 16 || ctx > 512)) continue;
      if (ctx < max_len) g.push_back({std::vector<std::pair<int32_t, int32_t>>(size_t(s), {ctx, 1}), true});
    }
  // Mixed steps, as continuous batching makes them: one prompt joining running decodes.
  for (int32_t n : {32, 128, 512})
    for (int32_t s : {1, 8, 32}) {
      if (quick && s > 8) continue;
      GridPlan p{{{0, n}}, true};
      for (int32_t i = 0; i < s; ++i) p.seqs.push_back({256, 1});
      g.push_back(p);
    }
  return g;
}
}  // namespace

double predict_seconds(const FittedCoefficients& c, const PlanFeatures& f, bool after_idle) {
  const double t = c.overhead_s + c.per_token_s * f.tokens + c.per_seq_s * f.seqs + c.per_attn_pair_s * f.attn_pairs +
                   c.per_context_token_s * f.context_tokens + c.per_sample_s * f.samples;
  return after_idle ? t * c.idle_factor : t;
}

FittedCoefficients fit_cost_model(const std::vector<CalibrationPoint>& all) {
  std::vector<CalibrationPoint> points;
  for (const auto& p : all)
    if (!p.after_idle) points.push_back(p);
  if (points.size() < size_t(kFeatures))
    throw InputError(fmt::format("calibrate: {} back-to-back steps measured, at least {} are needed to fit: "
                                 "give a workload with more requests", points.size(), kFeatures));
  std::array<bool, kFeatures> active;
  active.fill(true);
  Eigen::VectorXd coef = Eigen::VectorXd::Zero(kFeatures);
  for (int iter = 0; iter < kFeatures; ++iter) {
    std::vector<int> cols;
    for (int j = 0; j < kFeatures; ++j)
      if (active[size_t(j)]) cols.push_back(j);
    Eigen::MatrixXd A(points.size(), cols.size());
    Eigen::VectorXd b(points.size());
    for (size_t i = 0; i < points.size(); ++i) {
      const auto r = row_of(points[i].f);
      const double w = 1.0 / points[i].seconds;  // relative error
      for (size_t k = 0; k < cols.size(); ++k) A(long(i), long(k)) = r(cols[k]) * w;
      b(long(i)) = 1.0;
    }
    const Eigen::VectorXd x = A.colPivHouseholderQr().solve(b);
    coef.setZero();
    bool negative = false;
    for (size_t k = 0; k < cols.size(); ++k) coef(cols[k]) = x(long(k));
    // Drop the most negative coefficient and refit.
    int worst = -1;
    for (size_t k = 0; k < cols.size(); ++k)
      if (x(long(k)) < 0 && (worst < 0 || x(long(k)) < coef(worst))) worst = cols[k];
    if (worst >= 0) {
      active[size_t(worst)] = false;
      negative = true;
    }
    if (!negative) break;
    coef(worst) = 0;
  }
  FittedCoefficients c;
  c.overhead_s = std::max(0.0, coef(0));
  c.per_token_s = std::max(0.0, coef(1));
  c.per_seq_s = std::max(0.0, coef(2));
  c.per_attn_pair_s = std::max(0.0, coef(3));
  c.per_context_token_s = std::max(0.0, coef(4));
  c.per_sample_s = std::max(0.0, coef(5));
  std::vector<double> ratio;
  for (const auto& p : all)
    if (p.after_idle) ratio.push_back(p.seconds / predict_seconds(c, p.f, false));
  if (!ratio.empty()) {
    std::sort(ratio.begin(), ratio.end());
    c.idle_factor = std::clamp(ratio[ratio.size() / 2], 0.5, 10.0);
  }
  return c;
}

namespace {
// The grid: each batch shape timed back to back (round-robin, median of reps), then again
// after 20 ms of idleness.
std::vector<CalibrationPoint> grid_points(const ModelSpec& m, int reps_in, bool quick) {
  const int reps = std::max(1, reps_in);
  const auto plans = grid(m.max_model_len, quick);
  int32_t max_tokens = 0;
  for (const auto& p : plans) {
    int32_t t = 0;
    for (auto [c0, n] : p.seqs) t += (c0 + n + 15) / 16 * 16;
    max_tokens = std::max(max_tokens, t);
  }
  const int32_t bs = 16, blocks = max_tokens / bs;
  cpu::check_fits_in_memory(m, m.kv_bytes_per_token(4) * double(max_tokens));  // fp32 K and V
  cpu::LlamaModel model(m, cpu::dummy_weights(m, 1), blocks, bs);
  Rng rng(2);
  // Fill the KV store once with real-looking values (never time on zeros).
  {
    StepPlan warm;
    std::vector<int32_t> table(size_t(std::min(blocks, m.max_model_len / bs)));
    for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i);
    for (int32_t b0 = 0; b0 < blocks; b0 += int32_t(table.size())) {
      for (size_t i = 0; i < table.size(); ++i) table[i] = std::min(blocks - 1, b0 + int32_t(i));
      const int32_t n = int32_t(table.size()) * bs;
      warm.clear();
      warm.seqs.push_back({0, n, 0, false, table});
      warm.num_tokens = n;
      for (int32_t i = 0; i < n; ++i) warm.tokens.push_back(Token(rng.uniform_int(0, m.vocab - 1)));
      std::vector<Token> s;
      model.forward(warm, warm.tokens, s);
    }
  }
  // Build every grid plan first, then time them round-robin: a burst of interference from
  // elsewhere on the machine then touches one repetition of many points, not all
  // repetitions of one, and the per-point median discards it.
  std::vector<StepPlan> grid_plans(plans.size());
  std::vector<std::vector<std::vector<int32_t>>> tables(plans.size());
  for (size_t p = 0; p < plans.size(); ++p) {
    const GridPlan& g = plans[p];
    StepPlan& plan = grid_plans[p];
    tables[p].assign(g.seqs.size(), {});
    int32_t next = 0;
    for (size_t i = 0; i < g.seqs.size(); ++i) {
      const auto [c0, n] = g.seqs[i];
      for (int32_t b = 0; b < (c0 + n + bs - 1) / bs; ++b) tables[p][i].push_back(next++);
      plan.seqs.push_back({ReqId(i), n, c0, g.samples, tables[p][i]});
      plan.num_tokens += n;
      plan.num_samples += g.samples;
      for (int32_t k = 0; k < n; ++k) plan.tokens.push_back(Token(rng.uniform_int(0, m.vocab - 1)));
    }
  }
  fmt::print(stderr, "calibrating {} on the CPU, {} threads, {} grid points x {} reps\n", m.name, cpu::threads(), plans.size(), reps);
  std::vector<std::vector<double>> times(plans.size());
  std::vector<Token> sampled;
  for (int r = 0; r <= reps; ++r) {
    for (size_t p = 0; p < plans.size(); ++p) {
      sampled.clear();
      const auto t0 = std::chrono::steady_clock::now();
      model.forward(grid_plans[p], grid_plans[p].tokens, sampled);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) times[p].push_back(s);  // round 0 warms caches
    }
  }
  std::vector<CalibrationPoint> points;
  for (size_t p = 0; p < plans.size(); ++p) {
    std::sort(times[p].begin(), times[p].end());
    points.push_back({plan_features(grid_plans[p]), times[p][times[p].size() / 2]});
  }
  // The same steps after the backend sat idle (as after a quiet spell between arrivals):
  // threads, caches and clocks wake up. Their ratio to the back-to-back fit is the idle factor.
  for (int r = 0; r < std::max(1, reps / 2); ++r)
    for (size_t p = 0; p < plans.size(); ++p) {
      sampled.clear();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const auto t0 = std::chrono::steady_clock::now();
      model.forward(grid_plans[p], grid_plans[p].tokens, sampled);
      points.push_back({plan_features(grid_plans[p]),
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), true});
    }
  return points;
}

// Every step of a real run of `workload` on the CPU backend, in real time: the steps as the
// engine makes them, with its gaps between steps and its mix of shapes.
std::vector<CalibrationPoint> live_points(const std::string& workload, const ExecutorFactory* factory, ModelSpec& m,
                                          double& memory_gb) {
  Workload w = load_workload(workload);
  std::unique_ptr<executor_i> exec =
      factory ? (*factory)(w)
              : cpu::make_cpu_executor(w.model, w.seed, w.engine.resolved_kv_blocks, w.engine.block_size,
                                       w.engine.deterministic, w.engine.tp);
  m = w.model;
  memory_gb = w.hardware.memory_bytes / 1e9;
  WallClock clock;
  Engine e(w, generate_requests(w), *exec, clock);
  struct Collect : run_observer_i {
    std::vector<CalibrationPoint> pts;
    std::vector<Time> start, end;
    void on_step(const StepRecord& r) override {
      pts.push_back({plan_features(*r.plan), to_seconds(r.elapsed), r.plan->after_idle});
      start.push_back(r.start);
      end.push_back(r.start + r.elapsed);
    }
  } collect;
  e.add_observer(&collect);
  fmt::print(stderr, "calibrating on the steps of {} (real time, {} requests)\n", workload, e.requests().size());
  e.run();
  // The simulator runs back-to-back steps with no gap, but a real loop spends time between
  // them (planning, recording). Charge it to the step before: a step followed at once by
  // another counts from its start to the next start; others get the median such gap.
  auto& p = collect.pts;
  std::vector<Duration> gaps;
  for (size_t i = 0; i + 1 < p.size(); ++i)
    if (!p[i + 1].after_idle) gaps.push_back(collect.start[i + 1] - collect.end[i]);
  std::sort(gaps.begin(), gaps.end());
  const double median_gap = gaps.empty() ? 0.0 : to_seconds(gaps[gaps.size() / 2]);
  for (size_t i = 0; i < p.size(); ++i)
    p[i].seconds = (i + 1 < p.size() && !p[i + 1].after_idle) ? to_seconds(collect.start[i + 1] - collect.start[i])
                                                              : p[i].seconds + median_gap;
  fmt::print(stderr, "engine loop time between back-to-back steps: median {:.1f} us\n", median_gap * 1e6);
  return collect.pts;
}
}  // namespace

int calibrate_command(const std::vector<std::string>& args, const std::map<std::string, ExecutorFactory>& backends) {
  namespace po = boost::program_options;
  po::options_description opts("tandem calibrate");
  opts.add_options()("backend", po::value<std::string>()->default_value("cpu"), "cpu, or cuda in a CUDA build")(
      "model", po::value<std::string>()->default_value("tiny"), "model preset (grid mode)")(
      "workload", po::value<std::vector<std::string>>()->composing(),
      "fit on every step of real runs of these workloads (repeatable) instead of a grid")(
      "out", po::value<std::string>(), "profile to write (YAML)")(
      "threads", po::value<int>()->default_value(0), "threads (0: all cores)")(
      "reps", po::value<int>()->default_value(5), "grid mode: timed repetitions per point (median)")(
      "quick", po::bool_switch(), "grid mode: a smaller grid");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(opts).run(), vm);
  po::notify(vm);
  const std::string backend = vm["backend"].as<std::string>();
  const auto factory = backends.find(backend);
  if (backend != "cpu" && factory == backends.end()) {
    std::string known = "cpu";
    for (const auto& [name, f] : backends) known += ", " + name;
    throw InputError(fmt::format("calibrate --backend {}: not available in this build (known: {})", backend, known));
  }
  if (backend != "cpu" && !vm.count("workload"))
    throw InputError(fmt::format("calibrate --backend {}: give --workload (grid mode is CPU-only)", backend));
  if (!vm.count("out")) throw InputError("calibrate: --out PROFILE.yaml is required");
  if (vm.count("workload") && !vm["model"].defaulted())
    throw InputError("calibrate: give --workload (fit on its steps) or --model (fit on a grid), not both");
  for (const char* k : {"reps", "quick"})  // grid-mode options: unused with --workload
    if (vm.count("workload") && !vm[k].defaulted())
      throw InputError(fmt::format("calibrate: --{} applies to grid mode (--model), not to --workload", k));
  if (backend != "cpu" && !vm["threads"].defaulted())
    throw InputError(fmt::format("calibrate --threads: only the CPU backend uses threads (this one is {})", backend));
  if (const int reps = vm["reps"].as<int>(); reps < 1 || reps > 1000)
    throw InputError(fmt::format("calibrate: --reps {}: must be in [1, 1000]", reps));
  {  // fail now, not after minutes of measuring
    std::ofstream probe(vm["out"].as<std::string>(), std::ios::app);
    if (!probe) throw InputError(fmt::format("calibrate: cannot write {}", vm["out"].as<std::string>()));
  }
  cpu::set_threads(vm["threads"].as<int>());
  ModelSpec m;
  std::vector<CalibrationPoint> points;
  std::string source;
  // The profile's memory: this machine's RAM for the CPU, the workload's hardware otherwise.
  double memory_gb = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE)) / 1e9;
  if (vm.count("workload")) {
    // Several workloads, e.g. the same traffic under each policy, cover more step shapes.
    std::string names;
    for (const std::string& wl : vm["workload"].as<std::vector<std::string>>()) {
      ModelSpec mw;
      auto pts = live_points(wl, backend == "cpu" ? nullptr : &factory->second, mw, memory_gb);
      if (!names.empty() && mw.name != m.name)
        throw InputError(fmt::format("calibrate: {} uses model '{}', the others '{}'", wl, mw.name, m.name));
      m = mw;
      points.insert(points.end(), pts.begin(), pts.end());
      names.append(names.empty() ? "" : ", ").append(wl);
    }
    source = fmt::format("every step of real runs of {}", names);
  } else {
    auto preset = model_preset(vm["model"].as<std::string>());
    if (!preset) throw InputError(fmt::format("calibrate: unknown model preset '{}' (known: {})", vm["model"].as<std::string>(), model_preset_names()));
    m = *preset;
    points = grid_points(m, vm["reps"].as<int>(), vm["quick"].as<bool>());
    source = fmt::format("a grid of batch shapes, median of {} reps", vm["reps"].as<int>());
  }
  FittedCoefficients c = fit_cost_model(points);
  c.backend = backend;
  c.model = m.name;
  c.threads = backend == "cpu" ? cpu::threads() : 0;
  std::vector<double> err;
  const bool print_all = points.size() <= 200;
  if (print_all)
    fmt::print("{:>8}{:>6}{:>14}{:>6}{:>12}{:>12}{:>9}\n", "tokens", "seqs", "context", "idle", "measured_ms", "fitted_ms", "error");
  for (const auto& p : points) {
    const double pred = predict_seconds(c, p.f, p.after_idle);
    err.push_back(std::fabs(pred - p.seconds) / p.seconds);
    if (print_all)
      fmt::print("{:>8.0f}{:>6.0f}{:>14.0f}{:>6}{:>12.3f}{:>12.3f}{:>8.1f}%\n", p.f.tokens, p.f.seqs, p.f.context_tokens,
                 p.after_idle ? "yes" : "", p.seconds * 1e3, pred * 1e3, 100 * (pred - p.seconds) / p.seconds);
  }
  std::vector<double> sorted = err;
  std::sort(sorted.begin(), sorted.end());
  std::ofstream out(vm["out"].as<std::string>());
  if (!out) throw InputError(fmt::format("calibrate: cannot write {}", vm["out"].as<std::string>()));
  fmt::print(out,
             "# tandem calibrate --backend {}, model {}: step time fitted to {} measured steps\n"
             "# ({}); relative error median {:.1f}%, p90 {:.1f}%.\n"
             "name: {}-{}-fitted\n"
             "memory_gb: {:.1f}\n"
             "fitted:\n"
             "  backend: {}\n  model: {}\n  threads: {}\n"
             "  overhead_us: {}\n  per_token_us: {}\n  per_seq_us: {}\n  per_attn_pair_ns: {}\n"
             "  per_context_token_ns: {}\n  per_sample_us: {}\n  idle_factor: {}\n",
             backend, m.name, points.size(), source, 100 * sorted[sorted.size() / 2], 100 * sorted[sorted.size() * 9 / 10],
             backend, m.name, memory_gb, backend, m.name,
             c.threads, c.overhead_s * 1e6, c.per_token_s * 1e6, c.per_seq_s * 1e6, c.per_attn_pair_s * 1e9,
             c.per_context_token_s * 1e9, c.per_sample_s * 1e6, c.idle_factor);
  fmt::print("idle factor (steps after the backend sat idle / back-to-back fit): {:.3f}\n", c.idle_factor);
  fmt::print("fit: relative error median {:.1f}%, p90 {:.1f}%, max {:.1f}% over {} steps; profile written to {}\n",
             100 * sorted[sorted.size() / 2], 100 * sorted[sorted.size() * 9 / 10], 100 * sorted.back(), points.size(),
             vm["out"].as<std::string>());
  return 0;
}

}  // namespace tandem
