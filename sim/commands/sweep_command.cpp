// `tandem sweep`: the command line over sweep_file (the file), sweep_run (the runs) and
// sweep_results (the tables). A local sweep is plan + run + collect in one process; on a
// cluster the three are separate commands (tools/sweep-ray, tools/sweep/).
#include "sim/commands/sweep_command.h"

#include <fmt/format.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "sim/sweep/sweep_file.h"
#include "sim/sweep/sweep_results.h"
#include "sim/sweep/sweep_run.h"

namespace tandem {

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

constexpr const char* kSweepUsage =
    "usage:\n"
    "  tandem sweep SWEEP.yaml [--out DIR] [-j N] [--keep-runs] [--force] [--quiet]\n"
    "      plan, run every point on N threads (default: all cores), collect; a point already in DIR/results\n"
    "      with the same resolved workload and build is not run again (--force runs it)\n"
    "  tandem sweep plan SWEEP.yaml --out DIR       # DIR/plan.json: every point, self-contained\n"
    "  tandem sweep run DIR --index I [--count K] [-j N] [--stdout] [--keep-runs]\n"
    "      points I..I+K-1 (K: 1) into DIR/results/point-I.json, or as one JSON array on stdout\n"
    "  tandem sweep collect DIR                     # DIR/results.csv, results.json, capacity.csv; the table\n";

// Progress on stderr when it is a terminal, at most 4 times a second.
struct SweepProgress {
  bool enabled = isatty(2) != 0;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now(), last{};
  bool printed = false;
  void operator()(int64_t runs, int64_t done, int64_t points) {
    if (!enabled) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last < std::chrono::milliseconds(250) && done < points) return;
    last = now;
    const double s = std::chrono::duration<double>(now - start).count();
    const double eta = done > 0 ? s * double(points - done) / double(done) : 0;
    fmt::print(stderr, "\rsweep: {}/{} points, {} runs, {:.1f} s{}   ", done, points, runs, s,
               done > 0 && done < points ? fmt::format(", about {:.0f} s left", eta) : "");
    printed = true;
  }
  void finish() {
    if (printed) fmt::print(stderr, "\n");
    printed = false, enabled = false;
  }
  ~SweepProgress() { finish(); }
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out.flush()) throw InputError(fmt::format("{}: cannot write", path));
}

void make_out_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw InputError(fmt::format("--out {}: cannot create the folder", dir));
}

// The points without a complete result, apart: those that never ran (no result in DIR/results/)
// and those whose run failed (their errors are in results.json).
int report_missing(const std::vector<int64_t>& missing, const std::map<int64_t, nlohmann::json>& results,
                   const std::string& dir) {
  if (missing.empty()) return 0;
  std::vector<int64_t> not_run, failed;
  for (const int64_t i : missing) (results.count(i) ? failed : not_run).push_back(i);
  const auto listed = [](const std::vector<int64_t>& v) {
    std::string list;
    for (size_t i = 0; i < v.size() && i < 20; ++i) list += (i ? ", " : "") + std::to_string(v[i]);
    if (v.size() > 20) list += fmt::format(" and {} more", v.size() - 20);
    return list;
  };
  if (!not_run.empty())
    std::cerr << fmt::format(
        "tandem: sweep: {} point(s) never ran (no result in {}/results/): {}; run them with tandem sweep run {} "
        "--index I\n",
        not_run.size(), dir, listed(not_run), dir);
  if (!failed.empty())
    std::cerr << fmt::format(
        "tandem: sweep: {} point(s) failed: {} (their errors are in {}/results.json; run them again with tandem "
        "sweep run {} --index I)\n",
        failed.size(), listed(failed), dir, dir);
  return 1;
}

po::variables_map parse(const std::vector<std::string>& args, po::options_description& opts,
                        const po::positional_options_description& pos) {
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(opts).positional(pos).run(), vm);
  po::notify(vm);
  return vm;
}

int cmd_local(const std::vector<std::string>& args) {
  po::options_description opts("options");
  opts.add_options()("sweep", po::value<std::string>(), "sweep YAML")(
      "out", po::value<std::string>(), "folder for plan.json, results/, results.csv (default: runs/sweep-NAME)")(
      "jobs,j", po::value<int>()->default_value(0), "threads (0: all cores)")("keep-runs", po::bool_switch(),
                                                                              "keep each run's folder under DIR/runs")(
      "force", po::bool_switch(), "run every point, even those with a result for the same workload and build")(
      "quiet", po::bool_switch(), "no table on stdout");
  po::positional_options_description pos;
  pos.add("sweep", 1);
  const auto vm = parse(args, opts, pos);
  if (!vm.count("sweep")) throw InputError(std::string("sweep: missing SWEEP.yaml\n") + kSweepUsage);
  const std::string sweep = vm["sweep"].as<std::string>();
  const std::string dir =
      vm.count("out") ? vm["out"].as<std::string>() : "runs/sweep-" + fs::path(sweep).stem().string();
  const auto t0 = std::chrono::steady_clock::now();
  const SweepSpec spec = load_sweep(sweep);
  std::vector<SweepPoint> points = expand_points(spec);
  const nlohmann::json plan_j = plan_json(spec, points);
  const SweepPlan plan = plan_from(spec, std::move(points));
  make_out_dir(dir);
  write_text(dir + "/plan.json", plan_j.dump(1) + "\n");
  LoadedResults loaded;
  if (!vm["force"].as<bool>()) loaded = load_results(plan, dir, build_id());
  const int64_t stale = loaded.stale;
  std::map<int64_t, nlohmann::json>& done = loaded.points;
  // Another build's results are never reused: their points run again with this one.
  if (!loaded.other_build.empty())
    std::cerr << fmt::format("sweep: {} result(s) in {}/results of another build not reused (this build is {}): {}\n",
                             loaded.other_build.size(), dir, build_id(), loaded.other_build_text());
  std::vector<int64_t> todo;
  int64_t reused = 0;
  for (const auto& p : plan.points) {
    const auto it = done.find(p.index);
    if (it != done.end() && !it->second.contains("error")) {
      ++reused;
      write_point_result(dir, it->second);  // under its index in this plan
    } else {
      todo.push_back(p.index);
    }
  }
  SweepRunOptions o;
  o.threads = vm["jobs"].as<int>();
  if (vm["keep-runs"].as<bool>()) o.keep_dir = dir + "/runs";
  SweepProgress progress;
  o.progress = [&](int64_t r, int64_t d, int64_t n) { progress(r, d, n); };
  int64_t runs = 0;
  o.on_point = [&](const nlohmann::json& r) {
    write_point_result(dir, r);
    done[r["index"].get<int64_t>()] = r;
    runs += int64_t(r["runs"].size());
  };
  const auto t1 = std::chrono::steady_clock::now();
  run_points(plan, todo, o);
  const double run_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  progress.finish();
  std::ostringstream table;
  const std::vector<int64_t> missing = write_sweep_outputs(plan, done, dir, table);
  if (!vm["quiet"].as<bool>()) std::cout << table.str();
  std::cerr << fmt::format(
      "sweep: {} points ({} reused from {}/results{}), {} runs in {:.2f} s ({:.1f} runs/s, {} threads); "
      "{:.2f} s in all\nwrote {}/results.csv, {}/results.json{}\n",
      plan.points.size(), reused, dir, stale ? fmt::format(", {} results of another plan ignored", stale) : "", runs,
      run_s, run_s > 0 ? double(runs) / run_s : 0.0,
      o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency())),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), dir, dir,
      plan.capacity ? fmt::format(", {}/capacity.csv", dir) : "");
  return report_missing(missing, done, dir);
}

int cmd_plan(const std::vector<std::string>& args) {
  po::options_description opts("options");
  opts.add_options()("sweep", po::value<std::string>(), "sweep YAML")("out", po::value<std::string>(), "plan folder");
  po::positional_options_description pos;
  pos.add("sweep", 1);
  const auto vm = parse(args, opts, pos);
  if (!vm.count("sweep") || !vm.count("out"))
    throw InputError(std::string("sweep plan: needs SWEEP.yaml and --out DIR\n") + kSweepUsage);
  const SweepSpec spec = load_sweep(vm["sweep"].as<std::string>());
  const std::vector<SweepPoint> points = expand_points(spec);
  const std::string dir = vm["out"].as<std::string>();
  make_out_dir(dir);
  write_text(dir + "/plan.json", plan_json(spec, points).dump(1) + "\n");
  std::cout << fmt::format("{} points: {}/plan.json\n", points.size(), dir);
  return 0;
}

int cmd_run_slice(const std::vector<std::string>& args) {
  po::options_description opts("options");
  opts.add_options()("dir", po::value<std::string>(), "plan folder")("index", po::value<int64_t>(), "first point")(
      "count", po::value<int64_t>()->default_value(1), "points from --index")(
      "jobs,j", po::value<int>()->default_value(0), "threads (0: all cores)")(
      "stdout", po::bool_switch(), "print the results as one JSON array; write nothing")(
      "keep-runs", po::bool_switch(), "keep each run's folder under DIR/runs");
  po::positional_options_description pos;
  pos.add("dir", 1);
  const auto vm = parse(args, opts, pos);
  if (!vm.count("dir") || !vm.count("index"))
    throw InputError(std::string("sweep run: needs DIR and --index I\n") + kSweepUsage);
  const std::string dir = vm["dir"].as<std::string>();
  SweepPlan plan = read_plan(dir + "/plan.json");
  // A point's figures belong to the binary that computed them: this build runs only its own plan.
  if (plan.build != build_id())
    throw InputError(fmt::format(
        "sweep run: {}/plan.json was planned by build {}, and this tandem is build {}: run the points with the "
        "plan's build, or plan again with this one (tandem sweep plan SWEEP.yaml --out DIR)",
        dir, plan.build, build_id()));
  const int64_t first = vm["index"].as<int64_t>(), count = vm["count"].as<int64_t>();
  const int64_t n = int64_t(plan.points.size());
  if (first < 0 || first >= n)
    throw InputError(fmt::format("sweep run: --index {}: the plan has points 0..{}", first, n - 1));
  if (count < 1) throw InputError(fmt::format("sweep run: --count {}: at least 1", count));
  std::vector<int64_t> indices;
  for (int64_t i = first; i < std::min(n, first + count); ++i) indices.push_back(i);
  // Keys as this build computes them, with the files as they are here: a trace that differs from
  // the planner's gives a key the plan does not hold, which collect and tools/sweep-ray refuse.
  rekey_points(plan, indices);
  const bool to_stdout = vm["stdout"].as<bool>();
  SweepRunOptions o;
  o.threads = vm["jobs"].as<int>();
  if (vm["keep-runs"].as<bool>()) o.keep_dir = dir + "/runs";
  if (!to_stdout) o.on_point = [&](const nlohmann::json& r) { write_point_result(dir, r); };
  const std::vector<nlohmann::json> results = run_points(plan, indices, o);
  bool failed = false;
  for (const auto& r : results) failed = failed || r.contains("error");
  if (to_stdout) std::cout << nlohmann::json(results).dump() << "\n";
  for (const auto& r : results)
    if (r.contains("error"))
      std::cerr << fmt::format("tandem: sweep: point {}: {}\n", r["index"].get<int64_t>(),
                               r["error"].get<std::string>());
  return failed ? 1 : 0;
}

int cmd_collect(const std::vector<std::string>& args) {
  po::options_description opts("options");
  opts.add_options()("dir", po::value<std::string>(), "plan folder")("quiet", po::bool_switch(), "no table");
  po::positional_options_description pos;
  pos.add("dir", 1);
  const auto vm = parse(args, opts, pos);
  if (!vm.count("dir")) throw InputError(std::string("sweep collect: needs DIR\n") + kSweepUsage);
  const std::string dir = vm["dir"].as<std::string>();
  const SweepPlan plan = read_plan(dir + "/plan.json");
  const LoadedResults loaded = load_results(plan, dir, plan.build);
  if (!loaded.other_build.empty())
    throw InputError(fmt::format(
        "sweep collect: {}: {} result(s) of another build than the plan's ({}): {}; run those points with the "
        "plan's build (tandem sweep run {} --index I), or plan again with theirs",
        dir, loaded.other_build.size(), plan.build, loaded.other_build_text(), dir));
  const int64_t stale = loaded.stale;
  const auto& results = loaded.points;
  std::ostringstream table;
  const std::vector<int64_t> missing = write_sweep_outputs(plan, results, dir, table);
  if (!vm["quiet"].as<bool>()) std::cout << table.str();
  if (stale) std::cerr << fmt::format("sweep collect: {} results of another plan ignored\n", stale);
  std::cerr << fmt::format("wrote {}/results.csv, {}/results.json{}\n", dir, dir,
                           plan.capacity ? fmt::format(", {}/capacity.csv", dir) : "");
  return report_missing(missing, results, dir);
}

}  // namespace

int sweep_command(const std::vector<std::string>& args) {
  if (args.empty()) throw InputError(std::string("sweep: missing SWEEP.yaml\n") + kSweepUsage);
  for (const auto& a : args)
    if (a == "--help" || a == "-h") {
      std::cout << kSweepUsage
                << "A sweep file: workload (the base), set (fixed keys), configs (named sets of keys), grid (key: "
                   "[values]),\nand rates: [...] or capacity: {slo: {ttft_p99_ms, tpot_p99_ms, itl_p99_ms, "
                   "goodput_min}, lo, hi, tolerance, probes}.\nREADME.md, \"Sweeps\".\n";
      return 0;
    }
  const std::string sub = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (sub == "plan") return cmd_plan(rest);
  if (sub == "run") return cmd_run_slice(rest);
  if (sub == "collect") return cmd_collect(rest);
  return cmd_local(args);
}

}  // namespace tandem
