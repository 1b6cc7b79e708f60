// tandem: the command line. Exit status: 0 ok, 2 bad input, 1 failure at run time.
#include <fmt/format.h>

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>

#include "backend/cpu/cpu_executor.h"
#include "backend/cpu/kernels.h"
#include "backend/cuda_module.h"
#include "serve/serve_command.h"
#include "sim/commands/calibrate_command.h"
#include "sim/commands/compare.h"
#include "sim/workload/config.h"
#include "sim/worker/worker_server.h"
#include "sim/run/executors.h"
#include "sim/commands/generate_command.h"
#include "sim/base/host_probe.h"
#include "sim/outputs/outputs.h"
#include "sim/workload/prefix_bound.h"
#include "sim/run/run_setup.h"
#include "sim/commands/sweep_command.h"

namespace po = boost::program_options;
using namespace tandem;

namespace {

constexpr const char* kUsage =
    "usage:\n"
    "  tandem run WORKLOAD.yaml [--backend sim|cpu|cuda] [--clock wall|virtual] [--threads N]\n"
    "             [--set KEY=VALUE ...] [--out DIR [--trace full|steps|requests|none]] [--quiet]\n"
    "  tandem validate WORKLOAD.yaml [--set KEY=VALUE ...] [--prefix-bound]\n"
    "  tandem compare RUN_DIR_A RUN_DIR_B\n"
    "  tandem calibrate --backend cpu|cuda --model PRESET [--workload W.yaml ...] --out PROFILE.yaml\n"
    "                   [--reps N] [--budget S] [--quick] [--threads N] [--accept-noisy]   # per-operator profile\n"
    "  tandem calibrate --backend cpu|cuda --workload W.yaml [--workload W2.yaml ...] --out PROFILE.yaml\n"
    "                   [--threads N] [--accept-noisy]                    # the older linear fit\n"
    "  tandem calibrate --channel --backend cpu|cuda --workload W.yaml [--set KEY=VALUE ...] --out CHANNEL.yaml\n"
    "                   [--reps N] [--threads N] [--accept-noisy]         # the KV channel, by transfer size\n"
    "  tandem calibrate --channel --from-run RUN_DIR --out CHANNEL.yaml [--accept-noisy]\n"
    "  tandem generate (--checkpoint DIR | --model PRESET [--seed N]) --prompt \"IDS\" [--max-tokens N]\n"
    "                  [--logits-out FILE] [--threads N]\n"
    "  tandem worker --listen HOST:PORT [--backend cpu|cuda] [--threads N] [--secret-file F] [--once]   # 1P1D "
    "decode over tcp\n"
    "                [--idle-timeout-ms MS] [--checkpoint-root DIR]\n"
    "  tandem serve WORKLOAD.yaml [--backend sim|cpu|cuda] [--listen HOST:PORT] [--api-key-file F] [--out DIR]\n"
    "               [--help for the limits]   # an OpenAI-compatible server: HTTP clients' requests\n"
    "  tandem sweep SWEEP.yaml [--out DIR] [-j N] [--keep-runs] [--force] [--quiet]   # a grid of knobs\n"
    "  tandem sweep plan SWEEP.yaml --out DIR | sweep run DIR --index I [--count K] [--stdout] | sweep collect DIR\n";

// `tandem validate`: the resolved workload (itself a valid workload), and the bound.
int validate_workload(const Workload& w, bool with_prefix_bound) {
  RequestSet rs = generate_requests(w);  // also checks trace and length files
  std::cout << to_yaml(w) << "# " << rs.requests.size() << " requests\n";
  if (with_prefix_bound) {
    // A comment, like the line above, so that the output stays a valid workload.
    const PrefixBound b = prefix_bound(w, rs);
    std::cout << fmt::format(
        "# prefix bound (unbounded cache, blocks available at arrival): {:.1f}% of the prompt tokens of the {} "
        "requests the run can serve (its hit rate's denominator), {} of them could hit; over all {} requests with a "
        "prompt ({} fail at arrival): {:.1f}% of prompt tokens, {:.1f}% of full blocks (block size {}){}\n",
        100 * b.servable_hit_rate(), b.servable_requests, b.requests_hit, b.requests, b.requests - b.servable_requests,
        100 * b.hit_rate(), 100 * b.block_hit_rate(), b.block_size,
        w.engine.enable_prefix_caching ? "" : "; prefix caching is off in this workload");
  }
  return 0;
}

// What `tandem run` was asked for, beyond the workload.
struct RunOptions {
  std::string backend = "sim";
  std::string clock;  // empty: virtual for the cost model, wall for a real backend
  int threads = 0;
  std::optional<std::string> out;  // none: no files
  TraceDetail trace = TraceDetail::Full;
  bool quiet = false;
};

// `tandem run`: the run set up from the workload (sim/run/run_setup.h), its requests from the
// workload's `requests:` section, and the engine run with progress, conditions and the summary.
int run_workload(Workload w, const RunOptions& o) {
  if (o.backend == "cpu") cpu::set_threads(o.threads);
  RunSetup run(std::move(w), {.backend = o.backend,
                              .clock = o.clock,
                              .threads = o.threads,
                              .cuda = cuda_executor_factory(),
                              .channels = cuda_channel_factory()});
  Engine& engine = run.start(generate_requests(run.workload));
  if (o.out) run.write_outputs(*o.out, o.trace);
  Summary s;
  // A measured run records the contention it ran under: its figures are only this machine's
  // while other work leaves its cores alone.
  std::optional<ConditionsProbe> probe;
  if (!run.exec.simulated()) probe.emplace(run.measuring_threads());
  {
    ProgressReporter progress(int64_t(engine.requests().size()));
    engine.add_observer(&progress);
    s = engine.run();
  }
  s.clock = run.clock_name;
  if (probe) {
    s.conditions = probe->finish();
    if (std::string warning = conditions_warning(*s.conditions, "this run"); !warning.empty()) {
      std::cerr << "tandem: warning: " << warning << "\n";
      s.warnings.push_back(std::move(warning));
    }
  }
  run.finish(s);
  s.peak_rss_kb = std::max(s.peak_rss_kb, peak_rss_kb());  // after the outputs, as summary.json
  if (!o.quiet) print_summary(std::cout, s);
  if (!s.run_error.empty()) {  // every request still in flight failed with the reason; the files are written
    std::cerr << "tandem: run failed: " << s.run_error << "\n";
    return 1;
  }
  return 0;
}

// `tandem run` and `tandem validate`: the command line, checked, then one of the two above.
int cmd_run(const std::vector<std::string>& args, bool validate_only) {
  // Run's and validate's options are parsed together, so that one given to the other command is
  // named as such (below); each command's --help lists only its own.
  po::options_description common, run_only, validate_opts, hidden;
  hidden.add_options()("workload", po::value<std::string>(), "workload YAML");
  common.add_options()("set", po::value<std::vector<std::string>>()->composing(),
                       "override a workload key: --set engine.max_num_seqs=8")("help,h", po::bool_switch(),
                                                                               "this help");
  run_only.add_options()("backend", po::value<std::string>()->default_value("sim"),
                         "sim (cost model), cpu (reference model) or cuda (GPU)")(
      "clock", po::value<std::string>(),
      "wall (real time; default for real backends) or virtual (jump between events)")(
      "threads", po::value<int>()->default_value(0), "CPU backend threads (0: all cores)")(
      "out", po::value<std::string>(),
      "write summary.json, requests.csv, steps.csv, trace.json, vllm_result.json here")(
      "trace", po::value<std::string>()->default_value("full"), "trace.json detail: full, steps, requests or none")(
      "quiet", po::bool_switch(), "no summary table on stdout");
  validate_opts.add_options()("prefix-bound", po::bool_switch(),
                              "also the ideal prefix-cache hit rate (unbounded cache)");
  po::options_description opts;
  opts.add(hidden).add(common).add(run_only).add(validate_opts);
  po::positional_options_description pos;
  pos.add("workload", 1);
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(opts).positional(pos).run(), vm);
  po::notify(vm);
  if (vm["help"].as<bool>()) {
    po::options_description shown("options");  // one list: the command's own options, then the shared ones
    for (const po::options_description* d : {validate_only ? &validate_opts : &run_only, &common})
      for (const auto& o : d->options()) shown.add(o);
    std::cout << (validate_only ? "usage: tandem validate WORKLOAD.yaml [--set KEY=VALUE ...] [--prefix-bound]\n"
                                : "usage: tandem run WORKLOAD.yaml [--backend sim|cpu|cuda] [--clock wall|virtual] "
                                  "[--threads N]\n                  [--set KEY=VALUE ...] [--out DIR [--trace "
                                  "full|steps|requests|none]] [--quiet]\n")
              << shown;
    return 0;
  }
  if (!vm.count("workload")) throw InputError(std::string("missing WORKLOAD.yaml\n") + kUsage);
  // An option the command does not use is a mistake, not something to ignore.
  const auto given = [&](const char* k) { return vm.count(k) && !vm[k].defaulted(); };
  if (validate_only)
    for (const char* k : {"backend", "clock", "threads", "out", "trace", "quiet"})
      if (given(k)) throw InputError(fmt::format("validate: --{} is an option of run, not of validate\n{}", k, kUsage));
  if (!validate_only && vm["prefix-bound"].as<bool>())
    throw InputError(fmt::format("run: --prefix-bound is an option of validate, not of run\n{}", kUsage));
  const auto sets = vm.count("set") ? parse_sets(vm["set"].as<std::vector<std::string>>()) : std::vector<Override>{};
  Workload w = load_workload(vm["workload"].as<std::string>(), sets);
  if (validate_only) return validate_workload(w, vm["prefix-bound"].as<bool>());
  RunOptions o;
  o.backend = vm["backend"].as<std::string>();
  if (given("threads") && o.backend != "cpu")
    throw InputError(fmt::format("--threads: only the CPU backend uses threads (this run's backend is {})", o.backend));
  o.threads = vm["threads"].as<int>();
  if (vm.count("clock")) o.clock = vm["clock"].as<std::string>();
  o.trace = parse_trace_detail(vm["trace"].as<std::string>());
  if (given("trace") && !vm.count("out")) throw InputError("--trace: sets trace.json's detail, which needs --out DIR");
  if (vm.count("out")) o.out = vm["out"].as<std::string>();
  o.quiet = vm["quiet"].as<bool>();
  if (o.quiet && !o.out)
    std::cerr << "tandem: note: --quiet without --out: the run's results are neither printed nor written\n";
  return run_workload(std::move(w), o);
}

}  // namespace

namespace {
int dispatch(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string cmd = argv[1];
  const std::vector<std::string> rest(argv + 2, argv + argc);
  const std::string who = cmd == "worker" ? "tandem worker" : cmd == "serve" ? "tandem serve" : "tandem";
  try {
    if (cmd == "run" || cmd == "validate") return cmd_run(rest, cmd == "validate");
    if (cmd == "compare") {
      if (rest.size() == 1 && (rest[0] == "--help" || rest[0] == "-h")) {
        std::cout << "usage: tandem compare RUN_DIR_A RUN_DIR_B\n"
                     "  metrics of two runs (folders written by tandem run --out) side by side, with (B-A)/A;\n"
                     "  notes when the runs are of different workloads or finished different requests\n";
        return 0;
      }
      if (rest.size() != 2) throw InputError(std::string("compare takes two run folders\n") + kUsage);
      return compare_runs(rest[0], rest[1], std::cout);
    }
    if (cmd == "generate") return generate_command(rest);
    if (cmd == "sweep") return sweep_command(rest);
    if (cmd == "worker") return worker_command(rest, cuda_executor_factory());
    if (cmd == "serve") return serve::serve_command(rest);
    if (cmd == "calibrate") {
      std::map<std::string, ExecutorFactory> backends;
      if (const ExecutorFactory* cuda = cuda_executor_factory()) backends["cuda"] = *cuda;
      return calibrate_command(rest, backends);
    }
    if (cmd == "-h" || cmd == "--help" || cmd == "help") {
      std::cout << kUsage;
      return 0;
    }
    throw InputError(fmt::format("unknown command '{}'\n{}", cmd, kUsage));
  } catch (const InputError& e) {
    std::cerr << who << ": " << e.what() << "\n";
    return 2;
  } catch (const YAML::Exception& e) {  // a shape of YAML the checked reader did not expect
    std::cerr << who << ": invalid workload YAML: " << e.what() << "\n";
    return 2;
  } catch (const po::error& e) {
    std::cerr << who << ": " << e.what() << "\n" << kUsage;
    return 2;
  } catch (const std::exception& e) {
    // A worker is a service, not a run: its errors (a port in use, a listener that failed) say so.
    std::cerr << (cmd == "worker" ? "tandem worker: " : cmd == "serve" ? "tandem serve: " : "tandem: run failed: ")
              << e.what() << "\n";
    return 1;
  }
}
}  // namespace

int main(int argc, char** argv) {
  const int rc = dispatch(argc, argv);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // cuBLASLt's library finalizers page in about 60 MB of its code at exit, after summary.json
  // took the process's peak RSS: skip them when this command loaded the CUDA module (only then
  // are they mapped). Every output file is closed by now, and the driver frees whatever a CUDA
  // run held.
  if (cuda_module_loaded()) {
    std::cout.flush();
    std::fflush(nullptr);
    std::_Exit(rc);
  }
#endif
  return rc;
}
