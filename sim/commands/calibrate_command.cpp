// `tandem calibrate`: the command line, and the two procedures it runs (the per-operator
// profile on a grid, and the older linear fit on served steps).
#include "sim/commands/calibrate_command.h"

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
#include <fstream>
#include <iostream>
#include <thread>

#include "backend/cpu/cpu_executor.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/llama.h"
#include "backend/warmup.h"
#include "core/host.h"
#include "core/rng.h"
#include "sim/calibrate/calibrate.h"
#include "sim/calibrate/calibrate_channel.h"
#include "sim/calibrate/calibrate_serve.h"
#include "sim/workload/config.h"
#include "sim/workload/config_sections.h"
#include "sim/engine/engine.h"
#include "sim/base/host_probe.h"

namespace tandem {

namespace {
// The workload whose engine section the grid runs under: the first --workload, else defaults
// that suit the backend (the workloads of this repository for it).
Workload grid_workload(const std::string& backend, const std::string& model,
                       const std::vector<std::string>& workloads) {
  if (!workloads.empty()) {
    Workload w = load_workload(workloads[0]);
    if (w.model.name != model)
      throw InputError(
          fmt::format("calibrate: {} uses model '{}', --model is '{}'", workloads[0], w.model.name, model));
    return w;
  }
  if (!model_preset(model))
    throw InputError(fmt::format("calibrate: unknown model preset '{}' (known: {})", model, model_preset_names()));
  const std::string engine = backend == "cpu"
                                 ? "{max_num_seqs: 64, max_num_batched_tokens: 2048, num_kv_blocks: 4096}"
                                 : "{max_num_seqs: 64, max_num_batched_tokens: 4096, num_kv_blocks: 16384}";
  return parse_workload(
      fmt::format("model: {}\nhardware: {}\nengine: {}\n"
                  "requests: {{count: 1, arrival: {{process: burst}}, prompt_len: 4, output_len: 2}}\n",
                  model,
                  backend == "cpu" ? "{name: cpu, peak_tflops: 0.1, mem_bandwidth_tbs: 0.02, "
                                     "step_overhead_us: 300, memory_gb: 16}"
                                   : "h200",
                  engine),
      "calibrate-defaults.yaml");
}

// Per-step relative errors of the profile on its own grid, by kind, for the printout.
void print_grid_errors(const OperatorProfile& p) {
  const ProfiledCostModel model(std::make_shared<OperatorProfile>(p));
  fmt::print("{:>8}{:>6}{:>8}{:>9}{:>8}{:>12}{:>12}{:>9}\n", "kind", "seqs", "tokens", "context", "sample",
             "measured_ms", "model_ms", "error");
  std::vector<std::vector<int32_t>> tables;
  for (const ProfileStep& s : p.raw) {
    if (s.idle || s.kind == "allreduce") continue;  // not a step: priced inside the others
    const double pred = model.estimate(plan_of_profile_step(s)).total_s();
    fmt::print("{:>8}{:>6}{:>8}{:>9}{:>8}{:>12.3f}{:>12.3f}{:>8.1f}%{}\n", s.kind, s.seqs, s.tokens, s.context,
               s.sampled ? "yes" : "", s.seconds * 1e3, pred * 1e3, 100 * (pred - s.seconds) / s.seconds,
               s.kind != "mixed" ? "" : p.mixed_fit ? "  (measures the mixed correction)" : "  (composition check)");
  }
}

// One line on the conditions, for the printout and the profile's header.
std::string conditions_note(const CalibrationConditions& c) {
  const auto pct = [](double x) { return x < 0 ? std::string("?") : fmt::format("{:.1f} %", 100 * x); };
  return fmt::format(
      "conditions: load average {:.2f} before, {:.2f} after; other processes' share of the CPU time {} during the "
      "grid, {} while serving; steal {}; the grid had its cores {} of the time; reference {} {:.3f} ms before the "
      "grid, {:.3f} after; repetitions' disagreement median {}, {} of {} shapes beyond {:.0f} %{}{}\n",
      c.load_before, c.load_after, pct(c.others_grid), pct(c.others_serving), pct(c.steal_grid),
      c.cpu_share_grid < 0 ? std::string("-") : pct(c.cpu_share_grid), c.reference,
      c.reference_before_ms, c.reference_after_ms, c.repeat_median < 0 ? "-" : fmt::format("+{:.1f} %", 100 * c.repeat_median),
      c.repeat_over, c.repeat_compared, 100 * kRepeatBound,
      c.grid_tries > 1 ? fmt::format("; grid {} of {} kept (the earlier would have been refused)", c.grid_tries, c.grid_tries)
                       : "",
      c.accepted_noisy ? " (ACCEPTED NOISY)" : "");
}

}  // namespace

namespace {
// --model: the grid on the backend, then (with --workload) the residuals on served traffic.
int calibrate_profiled(const std::string& backend, const std::string& model, const std::vector<std::string>& workloads,
                       const ExecutorFactory* factory, const GridOptions& opt, bool accept_noisy,
                       const std::string& out_path) {
  const double load_before = load_average();
  Workload w = grid_workload(backend, model, workloads);
  const ConditionsProbe probe(backend == "cpu" ? std::max(cpu::threads(), int(w.engine.tp)) : 1);
  const GridLimits limits{w.engine.resolved_kv_blocks, w.engine.block_size,   w.engine.max_num_batched_tokens,
                          w.engine.max_num_seqs,       w.model.max_model_len, w.model.vocab};
  OperatorProfile p;
  double loop_gap = 0;
  std::vector<ServedStep> served;
  {
    std::unique_ptr<executor_i> exec = executor_for(w, factory);
    GridOptions o = opt;
    o.fill_kv = backend != "cpu";
    o.graph_buckets = backend == "cuda" && w.engine.cuda_graph && w.engine.tp == 1;
    // The threads that compute at once: every rank has one at tp > 1; no more than the cores.
    o.cpu_threads = backend == "cpu" ? std::min(std::max(cpu::threads(), int(w.engine.tp)),
                                                std::max(1, int(std::thread::hardware_concurrency())))
                                     : 0;
    fmt::print(stderr, "calibrate: {} on the {} backend; grid limits: {} KV blocks of {}, {} tokens, {} sequences\n",
               model, backend, limits.num_blocks, limits.block_size, limits.max_tokens, limits.max_seqs);
    p = measure_until_agreed([&] { return measure_operator_profile(*exec, limits, o); });
  }
  p.conditions.load_before = load_before;
  if (backend == "cpu" && w.engine.tp > 1) {  // the all-reduces by size (a CUDA TP run needs 2+ GPUs: not here)
    std::vector<int32_t> sizes;
    for (int32_t t = 1; t < limits.max_tokens; t *= 2) sizes.push_back(t);
    sizes.push_back(limits.max_tokens);
    cpu::InProcessCommunicator comm(w.engine.tp);
    for (const ProfileStep& s : measure_allreduce(comm, w.model.hidden, w.model.layers, sizes, opt.reps))
      p.raw.push_back(s);
    derive_curves(p);
    fmt::print(stderr, "calibrate: tp {}: a step's {} all-reduces measured at {} sizes: {:.3f} ms at 1 token, {:.3f} ms "
               "at {}\n", w.engine.tp, 2 * w.model.layers, sizes.size(), p.allreduce.at(1) * 1e3,
               p.allreduce.at(limits.max_tokens) * 1e3, limits.max_tokens);
  }
  // A grid measured under contention is refused before the served traffic (minutes) runs: its
  // fastest repetitions would not be the machine's quiet level, and nothing later corrects that.
  if (const std::string why = contention_refusal(p.conditions); !why.empty()) {
    if (!accept_noisy) {  // exit 3: not bad input (2), not a failure of the run (1)
      fmt::print(stderr, "tandem: {}\n", fmt::format(
          "calibrate: the grid was measured under contention, profile not written: {}. Other processes used {} of "
          "the machine's CPU time during it (load average {:.2f}). Run it again when the machine is quieter, or "
          "give --accept-noisy to write it anyway (marked so in the file)",
          why, p.conditions.others_grid < 0 ? "?" : fmt::format("{:.0f} %", 100 * p.conditions.others_grid),
          load_before));
      return 3;
    }
    p.conditions.accepted_noisy = true;
    fmt::print(stderr, "calibrate: written although measured under contention (--accept-noisy): {}\n", why);
  }
  p.backend = backend;
  p.model = w.model.name;
  p.tp = w.engine.tp;
  p.threads = backend == "cpu" ? cpu::threads() : 0;
  p.hardware = backend == "cpu" ? fmt::format("{}, {} threads", cpu_name(), cpu::threads()) : gpu_name();
  p.code_version = git_version();
  p.measured_at = utc_now();
  p.engine =
      fmt::format("deterministic {}, max_num_seqs {}, max_num_batched_tokens {}, block_size {}{}",
                  w.engine.deterministic, w.engine.max_num_seqs, w.engine.max_num_batched_tokens, w.engine.block_size,
                  backend == "cuda"
                      ? fmt::format(", cuda_graph {}, cuda_attention {}{}", w.engine.cuda_graph, w.engine.cuda_attention,
                                    (w.engine.cuda_row_kernels == "v1" ? ""
                                                                       : ", cuda_row_kernels " + w.engine.cuda_row_kernels) +
                                        (w.engine.cuda_gemm == "pinned" ? "" : ", cuda_gemm " + w.engine.cuda_gemm))
                      : "");
  print_grid_errors(p);
  std::string notes;
  if (p.idle_samples < kMinIdleSamples)
    notes += fmt::format("idle factor 1: only {} after-idle samples ({} needed)\n", p.idle_samples, kMinIdleSamples);
  if (!workloads.empty()) {
    const ProfiledCostModel predictor(std::make_shared<OperatorProfile>(p));
    const CpuSample serving0 = cpu_sample();
    for (const std::string& wl : workloads) {
      Workload ww = load_workload(wl);
      if (ww.model.name != w.model.name)
        throw InputError(
            fmt::format("calibrate: {} uses model '{}', the others '{}'", wl, ww.model.name, w.model.name));
      ServedRun run = serve(std::move(ww), factory, &predictor);
      served.insert(served.end(), run.steps.begin(), run.steps.end());
      loop_gap = std::max(loop_gap, run.loop_gap_s);
    }
    p.conditions.others_serving = cpu_shares(serving0, cpu_sample()).others;
    notes += refine_profile(p, served, loop_gap);
  }
  p.conditions.load_after = load_average();
  notes += conditions_note(p.conditions);
  const MeasureConditions whole = probe.finish();
  notes += fmt::format("measured under: {}\n", conditions_text(whole));
  if (const std::string warning = conditions_warning(whole, "the calibration"); !warning.empty()) {
    fmt::print(stderr, "tandem: warning: {}\n", warning);
    notes += fmt::format("WARNING: {}\n", warning);
  }
  fmt::print("{}", notes);
  std::string names;
  for (const std::string& wl : workloads) names.append(names.empty() ? "" : ", ").append(wl);
  std::string comment = fmt::format(
      "# tandem calibrate --backend {} --model {}: per-operator profile, {} measured steps\n"
      "# (synthetic shapes through the {} executor; curves interpolated from the raw table)",
      backend, p.model, p.raw.size(), backend);
  if (!names.empty()) comment += fmt::format("\n# refined on the served steps of {}", names);
  comment += "\n";
  for (size_t i = 0, j; i < notes.size(); i = j + 1) {
    j = notes.find('\n', i);
    if (j == std::string::npos) j = notes.size();
    comment += "# " + notes.substr(i, j - i) + "\n";
  }
  const double memory_gb = w.hardware.memory_bytes / 1e9 > 0 && backend != "cpu" ? w.hardware.memory_bytes / 1e9
                                                                                 : physical_memory_bytes() / 1e9;
  std::ofstream out(out_path);
  if (!out) throw InputError(fmt::format("calibrate: cannot write {}", out_path));
  out << config_detail::profile_file_text(p, fmt::format("{}-{}-profiled", backend, p.model), memory_gb, comment);
  if (!out.flush()) throw InputError(fmt::format("calibrate: cannot write {}", out_path));
  fmt::print("profile written to {} ({} raw steps, idle factor {:.3f})\n", out_path, p.raw.size(), p.idle_factor);
  return 0;
}
// --workload alone: the older linear fit on every step of the workloads served on the backend.
int calibrate_linear(const std::string& backend, const std::vector<std::string>& workloads, const ExecutorFactory* fac,
                     bool accept_noisy, const std::string& out_path) {
  ModelSpec m;
  std::vector<CalibrationPoint> points;
  double memory_gb = 0;
  // Several workloads, e.g. the same traffic under each policy, cover more step shapes.
  std::string names;
  const ConditionsProbe probe(backend == "cpu" ? cpu::threads() : 1);
  for (const std::string& wl : workloads) {
    Workload w = load_workload(wl);
    if (!names.empty() && w.model.name != m.name)
      throw InputError(fmt::format("calibrate: {} uses model '{}', the others '{}'", wl, w.model.name, m.name));
    m = w.model;
    memory_gb = backend == "cpu" ? physical_memory_bytes() / 1e9 : w.hardware.memory_bytes / 1e9;
    ServedRun run = serve(w, fac, nullptr);
    points.insert(points.end(), run.points.begin(), run.points.end());
    names.append(names.empty() ? "" : ", ").append(wl);
  }
  const MeasureConditions cond = probe.finish();
  const std::string source = fmt::format("every step of real runs of {}", names);
  FittedCoefficients c = fit_cost_model(points);
  c.backend = backend;
  c.model = m.name;
  c.threads = backend == "cpu" ? cpu::threads() : 0;
  std::vector<double> err;
  const bool print_all = points.size() <= 200;
  if (print_all)
    fmt::print("{:>8}{:>6}{:>14}{:>6}{:>12}{:>12}{:>9}\n", "tokens", "seqs", "context", "idle", "measured_ms",
               "fitted_ms", "error");
  for (const auto& p : points) {
    const double pred = predict_seconds(c, p.f, p.after_idle);
    err.push_back(std::fabs(pred - p.seconds) / p.seconds);
    if (print_all)
      fmt::print("{:>8.0f}{:>6.0f}{:>14.0f}{:>6}{:>12.3f}{:>12.3f}{:>8.1f}%\n", p.f.tokens, p.f.seqs,
                 p.f.context_tokens, p.after_idle ? "yes" : "", p.seconds * 1e3, pred * 1e3,
                 100 * (pred - p.seconds) / p.seconds);
  }
  std::vector<double> sorted = err;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2], p90 = sorted[sorted.size() * 9 / 10];
  const std::string measured = fmt::format("measured under: {}", conditions_text(cond));
  fmt::print("{}\n", measured);
  const std::string warning = conditions_warning(cond, "the calibration");
  if (!warning.empty()) fmt::print(stderr, "tandem: warning: {}\n", warning);
  std::string marks;
  if (median > kFitMedianErrorMax) {  // a fit this far off its own steps describes the contention, not the backend
    const std::string why = fmt::format(
        "the fit's median relative error over its {} steps is {:.1f} % (at most {:.0f} %){}",
        points.size(), 100 * median, 100 * kFitMedianErrorMax,
        warning.empty() ? "" : fmt::format("; other work took {:.0f} % of its cores' time", 100 * cond.taken));
    if (!accept_noisy) {  // exit 3, as the grid's refusal: not bad input (2), not a failure of the run (1)
      fmt::print(
          stderr,
          "tandem: calibrate: the linear fit was refused, profile not written: {}. Run it again when the machine "
          "is quieter, or give --accept-noisy to write it anyway (marked so in the file)\n",
          why);
      return 3;
    }
    fmt::print(stderr, "calibrate: written although its fit is this far off (--accept-noisy): {}\n", why);
    marks = fmt::format("# ACCEPTED NOISY (--accept-noisy): {}\n", why);
  }
  if (!warning.empty()) marks += fmt::format("# WARNING: {}\n", warning);
  std::ofstream out(out_path);
  if (!out) throw InputError(fmt::format("calibrate: cannot write {}", out_path));
  out << config_detail::fitted_profile_file_text(
      c,
      fmt::format("{}-{}-fitted{}", backend, m.name, marks.find("ACCEPTED NOISY") != std::string::npos ? "-noisy" : ""),
      memory_gb,
      fmt::format("# tandem calibrate --backend {}, model {}: step time fitted to {} measured steps\n"
                  "# ({}); relative error median {:.1f}%, p90 {:.1f}%.\n# {}\n{}",
                  backend, m.name, points.size(), source, 100 * median, 100 * p90, measured, marks));
  if (!out.flush()) throw InputError(fmt::format("calibrate: cannot write {}", out_path));
  fmt::print("idle factor (steps after the backend sat idle / back-to-back fit): {:.3f}\n", c.idle_factor);
  fmt::print("fit: relative error median {:.1f}%, p90 {:.1f}%, max {:.1f}% over {} steps; profile written to {}\n",
             100 * median, 100 * p90, 100 * sorted.back(), points.size(), out_path);
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
      "alone: the older linear fit on them (repeatable)")("out", po::value<std::string>(), "profile to write (YAML)")(
      "threads", po::value<int>()->default_value(0), "threads (0: all cores)")(
      "reps", po::value<int>()->default_value(5), "grid: timed repetitions per shape (the fastest is kept)")(
      "budget", po::value<double>()->default_value(110), "grid: seconds it may take (fewer repetitions if needed)")(
      "quick", po::bool_switch(), "grid: a smaller grid")(
      "accept-noisy", po::bool_switch(),
      "write the profile even when it was measured under contention (grid: the cores were taken, repetitions "
      "disagree or the reference step moved; linear fit: its median error is too large; channel: the sizes' "
      "repetitions spread too far, or --from-run's run warned), marked so in the file")(
      "channel", po::bool_switch(),
      "the workload's prefill/decode KV channel: its time per transfer size (--workload W.yaml)")(
      "from-run", po::value<std::string>(), "with --channel: fit on a served run's transfers (its --out folder)")(
      "set", po::value<std::vector<std::string>>()->composing(),
      "with --channel: KEY=VALUE over the workload, as tandem run's (repeatable)")("help,h", po::bool_switch(),
                                                                                   "this help");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(opts).run(), vm);
  po::notify(vm);
  if (vm["help"].as<bool>()) {
    std::cout
        << "usage: tandem calibrate --backend cpu|cuda --model PRESET [--workload W.yaml ...] --out PROFILE.yaml\n"
           "       tandem calibrate --backend cpu|cuda --workload W.yaml [--workload W2.yaml ...] --out PROFILE.yaml\n"
           "       tandem calibrate --channel --backend cpu|cuda --workload W.yaml [--set KEY=VALUE ...] --out "
           "CHANNEL.yaml "
           "[--reps N]\n"
           "       tandem calibrate --channel --from-run RUN_DIR --out CHANNEL.yaml\n"
        << opts;
    return 0;
  }
  const std::string backend = vm["backend"].as<std::string>();
  const auto factory = backends.find(backend);
  if (backend != "cpu" && factory == backends.end()) {
    std::string known = "cpu";
    for (const auto& [name, f] : backends) known += ", " + name;
    throw InputError(fmt::format("calibrate --backend {}: not available in this build (known: {})", backend, known));
  }
  const bool grid = vm.count("model") > 0;
  if (vm["channel"].as<bool>() && vm.count("from-run")) {
    if (grid || vm.count("workload") || !vm.count("out"))
      throw InputError("calibrate --channel --from-run RUN_DIR: give --out CHANNEL.yaml (and no --workload or --model)");
    return calibrate_channel_from_run(vm["from-run"].as<std::string>(), vm["out"].as<std::string>(),
                                      vm["accept-noisy"].as<bool>());
  }
  if (vm.count("from-run")) throw InputError("calibrate: --from-run goes with --channel");
  if (vm.count("set") && (!vm["channel"].as<bool>() || vm.count("from-run")))
    throw InputError("calibrate: --set goes with --channel --workload W.yaml");
  if (vm["channel"].as<bool>()) {
    if (grid || !vm.count("workload") || vm["workload"].as<std::vector<std::string>>().size() != 1 || !vm.count("out"))
      throw InputError("calibrate --channel: give one --workload W.yaml (its disaggregation.channel) and --out CHANNEL.yaml");
    if (const int reps = vm["reps"].as<int>(); reps < 1 || reps > 1000)
      throw InputError(fmt::format("calibrate: --reps {}: must be in [1, 1000]", reps));
    if (backend == "cpu") cpu::set_threads(vm["threads"].as<int>());
    return calibrate_channel(
        vm["workload"].as<std::vector<std::string>>()[0],
        vm.count("set") ? parse_sets(vm["set"].as<std::vector<std::string>>()) : std::vector<Override>{}, backend,
        backend == "cpu" ? nullptr : &factory->second, vm["threads"].as<int>(), vm["reps"].as<int>(),
        vm["out"].as<std::string>(), vm["accept-noisy"].as<bool>());
  }
  if (!grid && !vm.count("workload"))
    throw InputError("calibrate: give --model PRESET (per-operator profile) or --workload W.yaml (linear fit)");
  if (!vm.count("out")) throw InputError("calibrate: --out PROFILE.yaml is required");
  for (const char* k : {"reps", "quick", "budget"})  // grid options: unused by the linear fit
    if (!grid && !vm[k].defaulted())
      throw InputError(
          fmt::format("calibrate: --{} applies to the grid (--model), not to the linear fit (--workload alone)", k));
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
    return calibrate_profiled(backend, vm["model"].as<std::string>(), workloads, fac, o,
                              vm["accept-noisy"].as<bool>(), out_path);
  }
  return calibrate_linear(backend, workloads, fac, vm["accept-noisy"].as<bool>(), out_path);
}

}  // namespace tandem
