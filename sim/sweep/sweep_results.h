// A sweep's tables: results.csv / results.json (one row per point and rate), capacity.csv (one
// row per point, capacity searches), and the table printed at the end.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "sim/sweep/sweep_file.h"

namespace tandem {

// Every results/*.json under `dir` (a point object or an array of them) whose key is one of the
// plan's points, by index. A result run by a build other than `build` is never taken (its figures
// are another binary's): it is listed in other_build, whatever its key. Results of another plan of
// the same build (a key not in this one) are counted in `stale`.
struct LoadedResults {
  std::map<int64_t, nlohmann::json> points;
  int64_t stale = 0;
  struct OtherBuild {
    std::string file, build;
    int64_t index = -1;
  };
  std::vector<OtherBuild> other_build;
  // "results/point-3.json (point 3) was run by build B", the first few, and how many in all.
  std::string other_build_text() const;
};
LoadedResults load_results(const SweepPlan& plan, const std::string& dir, const std::string& build);
// One point's result file (results/point-I.json), written whole or not at all.
void write_point_result(const std::string& dir, const nlohmann::json& result);

// Writes results.csv, results.json (and capacity.csv) into `dir` and prints the table. Returns
// the indices without a result (or with an error), which the caller reports.
std::vector<int64_t> write_sweep_outputs(const SweepPlan& plan, const std::map<int64_t, nlohmann::json>& results,
                                         const std::string& dir, std::ostream& table);

}  // namespace tandem
