#include "sim/calibrate.h"
#include "sim/version.h"

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <unistd.h>

#include <Eigen/Dense>
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <thread>
#include <fstream>
#include <iostream>

#include "backend/cpu/kernels.h"
#include "backend/cpu/llama.h"
#include "backend/cpu/cpu_executor.h"
#include "backend/warmup.h"
#include "sim/config_sections.h"
#include "sim/config.h"
#include "sim/engine.h"
#include "core/rng.h"

namespace tandem {

namespace {
constexpr int kFeatures = 6;  // 1, tokens, seqs, attention pairs, context tokens, samples

Eigen::Matrix<double, 1, kFeatures> row_of(const PlanFeatures& f) {
  Eigen::Matrix<double, 1, kFeatures> r;
  r << 1.0, f.tokens, f.seqs, f.attn_pairs, f.context_tokens, f.samples;
  return r;
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
// Every step of a real run of `workload` on its backend, in real time: the steps as the
// engine makes them, with its gaps between steps and its mix of shapes. The backend warms up
// first, as `tandem run` does. With `predictor`, each step's prediction is kept too.
struct ServedRun {
  std::vector<CalibrationPoint> points;  // seconds: to the next step's start (or + the median gap)
  std::vector<ServedStep> steps;
  double loop_gap_s = 0;
};

// A backend's factory is given for cuda only; cpu is built here.
std::unique_ptr<executor_i> executor_for(Workload& w, const ExecutorFactory* factory) {
  return make_executor(w, factory ? "cuda" : "cpu", factory);
}

WarmUpShape warm_up_shape(const Workload& w) {
  return {w.engine.resolved_kv_blocks, w.engine.block_size, w.engine.max_num_batched_tokens, w.engine.max_num_seqs,
          w.model.max_model_len};
}

ServedRun serve(Workload& w, executor_i& exec, const cost_model_i* predictor) {
  warm_up(exec, warm_up_shape(w));
  WallClock clock;
  Engine e(w, generate_requests(w), exec, clock);
  struct Collect : run_observer_i {
    const cost_model_i* predictor = nullptr;
    ServedRun run;
    std::vector<Time> start, end;
    void on_step(const StepRecord& r) override {
      run.points.push_back({plan_features(*r.plan), to_seconds(r.elapsed), r.plan->after_idle});
      ServedStep s{step_kind(*r.plan), r.plan->after_idle, start.empty(), to_seconds(r.elapsed), 0};
      if (predictor) {
        StepPlan plan = *r.plan;  // priced as if back to back: the idle factor is fitted from these
        plan.after_idle = false;
        s.predicted_s = predictor->estimate(plan).total_s();
      }
      run.steps.push_back(s);
      start.push_back(r.start);
      end.push_back(r.start + r.elapsed);
    }
  } collect;
  collect.predictor = predictor;
  e.add_observer(&collect);
  fmt::print(stderr, "calibrate: serving {} (real time, {} requests)\n", w.path, e.requests().size());
  e.run();
  // The simulator runs back-to-back steps with no gap, but a real loop spends time between
  // them (planning, recording). Charge it to the step before: a step followed at once by
  // another counts from its start to the next start; others get the median such gap.
  ServedRun& run = collect.run;
  auto& p = run.points;
  std::vector<Duration> gaps;
  for (size_t i = 0; i + 1 < p.size(); ++i)
    if (!p[i + 1].after_idle) gaps.push_back(collect.start[i + 1] - collect.end[i]);
  std::sort(gaps.begin(), gaps.end());
  run.loop_gap_s = gaps.empty() ? 0.0 : to_seconds(gaps[gaps.size() / 2]);
  for (size_t i = 0; i < p.size(); ++i) {
    p[i].seconds = (i + 1 < p.size() && !p[i + 1].after_idle) ? to_seconds(collect.start[i + 1] - collect.start[i])
                                                              : p[i].seconds + run.loop_gap_s;
    run.steps[i].measured_s = p[i].seconds;
  }
  fmt::print(stderr, "calibrate: engine loop time between back-to-back steps: median {:.1f} us\n", run.loop_gap_s * 1e6);
  return run;
}

std::string git_version() { return TANDEM_CODE_VERSION; }  // the build's, not the current directory's

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

std::string gpu_name() {
  std::string v;
  if (FILE* f = popen("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1", "r")) {
    char buf[256];
    while (fgets(buf, sizeof buf, f)) v += buf;
    pclose(f);
  }
  while (!v.empty() && (v.back() == '\n' || v.back() == '\r')) v.pop_back();
  return v.empty() ? "unknown GPU" : v;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// The workload whose engine section the grid runs under: the first --workload, else defaults
// that suit the backend (the workloads of this repository for it).
Workload grid_workload(const std::string& backend, const std::string& model, const std::vector<std::string>& workloads) {
  if (!workloads.empty()) {
    Workload w = load_workload(workloads[0]);
    if (w.model.name != model)
      throw InputError(fmt::format("calibrate: {} uses model '{}', --model is '{}'", workloads[0], w.model.name, model));
    return w;
  }
  if (!model_preset(model))
    throw InputError(fmt::format("calibrate: unknown model preset '{}' (known: {})", model, model_preset_names()));
  const std::string engine = backend == "cpu" ? "{max_num_seqs: 64, max_num_batched_tokens: 2048, num_kv_blocks: 4096}"
                                              : "{max_num_seqs: 64, max_num_batched_tokens: 4096, num_kv_blocks: 16384}";
  return parse_workload(fmt::format("model: {}\nhardware: {}\nengine: {}\n"
                                    "requests: {{count: 1, arrival: {{process: burst}}, prompt_len: 4, output_len: 2}}\n",
                                    model, backend == "cpu" ? "{name: cpu, peak_tflops: 0.1, mem_bandwidth_tbs: 0.02, "
                                                              "step_overhead_us: 300, memory_gb: 16}"
                                                            : "h200",
                                    engine),
                        "calibrate-defaults.yaml");
}

// Per-step relative errors of the profile on its own grid, by kind, for the printout.
void print_grid_errors(const OperatorProfile& p) {
  const ProfiledCostModel model(std::make_shared<OperatorProfile>(p));
  fmt::print("{:>8}{:>6}{:>8}{:>9}{:>8}{:>12}{:>12}{:>9}\n", "kind", "seqs", "tokens", "context", "sample", "measured_ms",
             "model_ms", "error");
  std::vector<std::vector<int32_t>> tables;
  for (const ProfileStep& s : p.raw) {
    if (s.idle) continue;
    StepPlan plan;
    const bool samples = s.sampled || s.kind == "mixed";
    if (s.kind == "mixed") {  // the file records the prompt's size in tokens
      plan.add({0, s.tokens, 0, true, {}}, s.tokens);
      for (int32_t i = 0; i < s.seqs; ++i) plan.add({ReqId(i + 1), 1, s.context, true, {}}, s.context);
    } else {
      const int32_t prompt_len = s.kind == "decode" ? s.context : s.context + s.tokens;
      for (int32_t i = 0; i < s.seqs; ++i) plan.add({ReqId(i), s.tokens, s.context, samples, {}}, prompt_len);
    }
    const double pred = model.estimate(plan).total_s();
    fmt::print("{:>8}{:>6}{:>8}{:>9}{:>8}{:>12.3f}{:>12.3f}{:>8.1f}%{}\n", s.kind, s.seqs, s.tokens, s.context,
               s.sampled ? "yes" : "", s.seconds * 1e3, pred * 1e3, 100 * (pred - s.seconds) / s.seconds,
               s.kind == "mixed" ? "  (composition check)" : "");
  }
}

}  // namespace

std::string refine_profile(OperatorProfile& p, const std::vector<ServedStep>& steps, double loop_gap_s) {
  p.loop_gap_s = loop_gap_s;
  // Totals, not a median of ratios: TTFT and TPOT are means over requests, and on a shared
  // machine the steps have a heavy tail (a step preempted for a time slice). On this CPU the
  // median decode step was within 6 % of the grid while the total was 1.4-1.5 times it.
  double meas[3] = {0, 0, 0}, pred[3] = {0, 0, 0}, idle_meas = 0;
  int count[3] = {0, 0, 0}, idle = 0;
  for (const ServedStep& s : steps) {
    if (s.predicted_s <= 0 || s.first) continue;  // the first step follows the warm-up's own spell
    if (s.after_idle) {
      idle_meas += s.measured_s;
      ++idle;
      continue;
    }
    meas[int(s.kind)] += s.measured_s;
    pred[int(s.kind)] += s.predicted_s + loop_gap_s;
    ++count[int(s.kind)];
  }
  std::string out;
  double* target[3] = {&p.refine_decode, &p.refine_prefill, &p.refine_mixed};
  p.refine_steps = 0;
  for (int k = 0; k < 3; ++k) {
    const char* name = step_kind_name(StepKind(k));
    if (count[k] < kMinRefineSteps) {
      *target[k] = 1.0;
      out += fmt::format("residual {}: 1 ({} back-to-back steps of this kind, {} needed)\n", name, count[k], kMinRefineSteps);
      continue;
    }
    *target[k] = std::clamp(meas[k] / pred[k], 0.25, 4.0);
    p.refine_steps += count[k];
    out += fmt::format("residual {}: {:.4f} (total measured / predicted over {} steps)\n", name, *target[k], count[k]);
  }
  // After-idle steps of served traffic (real idle spells, of every length) replace the grid's
  // 20 ms sleeps, when there are enough of them; relative to the back-to-back prediction of
  // the same steps, residuals included.
  if (idle >= kMinIdleSamples) {
    double refined = 0;  // idle_pred, with each step's residual
    for (const ServedStep& s : steps)
      if (s.after_idle && s.predicted_s > 0 && !s.first)
        refined += (s.predicted_s + loop_gap_s) * *target[int(s.kind)];
    p.idle_factor = std::clamp(idle_meas / refined, 0.5, 10.0);
    p.idle_samples = idle;
    out += fmt::format("idle factor: {:.4f} from {} after-idle served steps\n", p.idle_factor, idle);
  } else {
    out += fmt::format("idle factor: {:.4f} kept from the grid ({} samples); served traffic had {} after-idle steps, "
                       "{} needed\n", p.idle_factor, p.idle_samples, idle, kMinIdleSamples);
  }
  return out;
}

namespace {
// --model: the grid on the backend, then (with --workload) the residuals on served traffic.
int calibrate_profiled(const std::string& backend, const std::string& model, const std::vector<std::string>& workloads,
                       const ExecutorFactory* factory, const GridOptions& opt, const std::string& out_path) {
  Workload w = grid_workload(backend, model, workloads);
  const GridLimits limits{w.engine.resolved_kv_blocks, w.engine.block_size, w.engine.max_num_batched_tokens,
                          w.engine.max_num_seqs, w.model.max_model_len, w.model.vocab};
  OperatorProfile p;
  double loop_gap = 0;
  std::vector<ServedStep> served;
  {
    std::unique_ptr<executor_i> exec = executor_for(w, factory);
    GridOptions o = opt;
    o.fill_kv = backend != "cpu";
    o.graph_buckets = backend == "cuda" && w.engine.cuda_graph && w.engine.tp == 1;
    fmt::print(stderr, "calibrate: {} on the {} backend; grid limits: {} KV blocks of {}, {} tokens, {} sequences\n",
               model, backend, limits.num_blocks, limits.block_size, limits.max_tokens, limits.max_seqs);
    p = measure_operator_profile(*exec, limits, o);
  }
  p.backend = backend;
  p.model = w.model.name;
  p.tp = w.engine.tp;
  p.threads = backend == "cpu" ? cpu::threads() : 0;
  p.hardware = backend == "cpu" ? fmt::format("{}, {} threads", cpu_name(), cpu::threads()) : gpu_name();
  p.code_version = git_version();
  p.measured_at = utc_now();
  p.engine = fmt::format("deterministic {}, max_num_seqs {}, max_num_batched_tokens {}, block_size {}{}",
                         w.engine.deterministic, w.engine.max_num_seqs, w.engine.max_num_batched_tokens,
                         w.engine.block_size,
                         backend == "cuda" ? fmt::format(", cuda_graph {}, cuda_attention {}", w.engine.cuda_graph,
                                                         w.engine.cuda_attention)
                                           : "");
  print_grid_errors(p);
  std::string notes;
  if (p.idle_samples < kMinIdleSamples)
    notes += fmt::format("idle factor 1: only {} after-idle samples ({} needed)\n", p.idle_samples, kMinIdleSamples);
  if (!workloads.empty()) {
    const ProfiledCostModel predictor(std::make_shared<OperatorProfile>(p));
    for (const std::string& wl : workloads) {
      Workload ww = load_workload(wl);
      if (ww.model.name != w.model.name)
        throw InputError(fmt::format("calibrate: {} uses model '{}', the others '{}'", wl, ww.model.name, w.model.name));
      std::unique_ptr<executor_i> exec = executor_for(ww, factory);
      ServedRun run = serve(ww, *exec, &predictor);
      served.insert(served.end(), run.steps.begin(), run.steps.end());
      loop_gap = std::max(loop_gap, run.loop_gap_s);
    }
    notes += refine_profile(p, served, loop_gap);
  }
  fmt::print("{}", notes);
  std::string names;
  for (const std::string& wl : workloads) names.append(names.empty() ? "" : ", ").append(wl);
  std::string comment = fmt::format("# tandem calibrate --backend {} --model {}: per-operator profile, {} measured steps\n"
                                    "# (synthetic shapes through the {} executor; curves interpolated from the raw table)",
                                    backend, p.model, p.raw.size(), backend);
  if (!names.empty()) comment += fmt::format("\n# refined on the served steps of {}", names);
  comment += "\n";
  for (size_t i = 0, j; i < notes.size(); i = j + 1) {
    j = notes.find('\n', i);
    if (j == std::string::npos) j = notes.size();
    comment += "# " + notes.substr(i, j - i) + "\n";
  }
  const double memory_gb = w.hardware.memory_bytes / 1e9 > 0 && backend != "cpu"
                               ? w.hardware.memory_bytes / 1e9
                               : double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE)) / 1e9;
  std::ofstream out(out_path);
  if (!out) throw InputError(fmt::format("calibrate: cannot write {}", out_path));
  out << config_detail::profile_file_text(p, fmt::format("{}-{}-profiled", backend, p.model), memory_gb, comment);
  if (!out.flush()) throw InputError(fmt::format("calibrate: cannot write {}", out_path));
  fmt::print("profile written to {} ({} raw steps, idle factor {:.3f})\n", out_path, p.raw.size(), p.idle_factor);
  return 0;
}
}  // namespace

int calibrate_command(const std::vector<std::string>& args, const std::map<std::string, ExecutorFactory>& backends) {
  namespace po = boost::program_options;
  po::options_description opts("tandem calibrate");
  opts.add_options()("backend", po::value<std::string>()->default_value("cpu"), "cpu, or cuda in a CUDA build")(
      "model", po::value<std::string>(), "model preset: measure the per-operator profile on a grid")(
      "workload", po::value<std::vector<std::string>>()->composing(),
      "with --model: refine on the served steps of these workloads (the first also sets the engine); "
      "alone: the older linear fit on them (repeatable)")(
      "out", po::value<std::string>(), "profile to write (YAML)")(
      "threads", po::value<int>()->default_value(0), "threads (0: all cores)")(
      "reps", po::value<int>()->default_value(5), "grid: timed repetitions per shape (the fastest is kept)")(
      "budget", po::value<double>()->default_value(110), "grid: seconds it may take (fewer repetitions if needed)")(
      "quick", po::bool_switch(), "grid: a smaller grid");
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
  const bool grid = vm.count("model") > 0;
  if (!grid && !vm.count("workload"))
    throw InputError("calibrate: give --model PRESET (per-operator profile) or --workload W.yaml (linear fit)");
  if (!vm.count("out")) throw InputError("calibrate: --out PROFILE.yaml is required");
  for (const char* k : {"reps", "quick", "budget"})  // grid options: unused by the linear fit
    if (!grid && !vm[k].defaulted())
      throw InputError(fmt::format("calibrate: --{} applies to the grid (--model), not to the linear fit (--workload alone)", k));
  if (backend != "cpu" && !vm["threads"].defaulted())
    throw InputError(fmt::format("calibrate --threads: only the CPU backend uses threads (this one is {})", backend));
  if (const int reps = vm["reps"].as<int>(); reps < 1 || reps > 1000)
    throw InputError(fmt::format("calibrate: --reps {}: must be in [1, 1000]", reps));
  if (const double b = vm["budget"].as<double>(); !(b > 0 && b <= 86400))
    throw InputError(fmt::format("calibrate: --budget {}: must be in (0, 86400] seconds", b));
  const std::string out_path = vm["out"].as<std::string>();
  {  // fail now, not after minutes of measuring
    std::ofstream probe(out_path, std::ios::app);
    if (!probe) throw InputError(fmt::format("calibrate: cannot write {}", out_path));
  }
  cpu::set_threads(vm["threads"].as<int>());
  const std::vector<std::string> workloads =
      vm.count("workload") ? vm["workload"].as<std::vector<std::string>>() : std::vector<std::string>{};
  const ExecutorFactory* fac = backend == "cpu" ? nullptr : &factory->second;
  if (grid) {
    GridOptions o;
    o.reps = vm["reps"].as<int>();
    o.quick = vm["quick"].as<bool>();
    o.budget_s = vm["budget"].as<double>();
    return calibrate_profiled(backend, vm["model"].as<std::string>(), workloads, fac, o, out_path);
  }
  ModelSpec m;
  std::vector<CalibrationPoint> points;
  double memory_gb = 0;
  // Several workloads, e.g. the same traffic under each policy, cover more step shapes.
  std::string names;
  for (const std::string& wl : workloads) {
    Workload w = load_workload(wl);
    if (!names.empty() && w.model.name != m.name)
      throw InputError(fmt::format("calibrate: {} uses model '{}', the others '{}'", wl, w.model.name, m.name));
    m = w.model;
    memory_gb = backend == "cpu" ? double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE)) / 1e9
                                 : w.hardware.memory_bytes / 1e9;
    std::unique_ptr<executor_i> exec = executor_for(w, fac);
    ServedRun run = serve(w, *exec, nullptr);
    points.insert(points.end(), run.points.begin(), run.points.end());
    names.append(names.empty() ? "" : ", ").append(wl);
  }
  const std::string source = fmt::format("every step of real runs of {}", names);
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
  std::ofstream out(out_path);
  if (!out) throw InputError(fmt::format("calibrate: cannot write {}", out_path));
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
             out_path);
  return 0;
}

}  // namespace tandem
