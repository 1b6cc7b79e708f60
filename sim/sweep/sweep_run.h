// Running a sweep's points: every simulated run on a thread of this process (a run costs what
// its simulation costs, not a process start), in rounds: all rates of every point, or each
// point's next capacity probes. Results are plain JSON objects, one per point (results/point-I.json).
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/request.h"
#include "sim/engine/metrics.h"
#include "sim/sweep/sweep_file.h"
#include "sim/sweep/sweep_search.h"

namespace tandem {

// The metric columns of results.csv, named as summary.json and `tandem compare` name them.
const std::vector<std::string>& sweep_metric_columns();

struct SweepRunOptions {
  int threads = 0;                      // 0: all cores
  std::optional<std::string> keep_dir;  // keep each run's folder (summary.json, requests.csv) under here
  // After each run: runs done so far, points done, points in all.
  std::function<void(int64_t runs, int64_t points_done, int64_t points)> progress;
  // Each point's result as soon as the point is complete (from the calling thread), so that an
  // interrupted sweep keeps what it finished.
  std::function<void(const nlohmann::json& result)> on_point;
};

// A point's workload at `rate`. `parsed`, the point's workload already parsed at another rate,
// saves parsing it again where the rate key is the arrival rate or a trace's rate_scale (both
// checked only for their range, which the sweep file's rates passed).
Workload point_workload(const SweepPlan& plan, const SweepPoint& point, double rate, const Workload* parsed = nullptr);
// Every request of a finished run, as the SLO verdict counts them (RunSloFigures).
RunSloFigures slo_figures(std::span<const Request> requests, const Workload& w, const Summary& s);

// One simulated run of `w` (a point's workload at `rate`): its summary's metrics
// (sweep_metric_columns) and what its SLO verdict reads; with run_dir its run folder written there.
struct PointRun {
  nlohmann::json out;
  RunSloFigures slo;
};
PointRun simulate_point(Workload w, double rate, const std::optional<std::string>& run_dir);

// Runs the points at `indices` of the plan; returns one result object per point, in order. A
// point whose run failed at run time has an "error" and no capacity; the others are complete.
std::vector<nlohmann::json> run_points(const SweepPlan& plan, const std::vector<int64_t>& indices,
                                       const SweepRunOptions& o);

}  // namespace tandem
