// A sweep file and the points it expands to. A sweep names a base workload, fixed overrides,
// named configurations and a grid over any workload keys (the dotted paths of `--set`), and what
// to find at each point: given arrival rates, or the capacity under an SLO. The plan (plan.json)
// holds every point's resolved workload, so a slice can run anywhere the binary runs.
#pragma once
#include <array>
#include <cstdint>
#include <utility>
#include <nlohmann/json.hpp>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sim/workload/config.h"

namespace tandem {

// The SLO a capacity search holds a run to; an unset term is not checked.
struct SweepSlo {
  std::optional<double> ttft_p99_ms, tpot_p99_ms, itl_p99_ms;
  std::optional<double> goodput_min;  // share of requests meeting the workload's `slo:` (summary goodput.fraction)
};

struct CapacitySpec {
  SweepSlo slo;
  double lo = 0, hi = 0;    // the bracket searched, in the rate key's unit
  double tolerance = 0.02;  // stop when hi/lo - 1 of the bracket is at most this
  int32_t probes = 1;       // rates run at once per round: 1 is bisection
};

// What a GPU costs, for "the cheapest configuration that meets the SLO at rate R" (README,
// "Sweeps"). Prices are the user's; without them tandem's examples, which the tables label as
// examples, never as facts. Not part of a point's key: a price changes no run.
struct CostSpec {
  std::map<std::string, double> gpu_hour_usd;  // $ per GPU-hour, by hardware name (the preset's)
  bool example_prices = false;                 // gpu_hour_usd not given: kExampleGpuHourUsd
  std::optional<double> at_rate;               // the rate the one-line answer is for
};

struct SweepSpec {
  std::string path;           // the sweep file
  std::string workload_path;  // the base workload, absolute
  std::vector<Override> fixed;
  struct Config {
    std::string name;
    std::vector<Override> set;
  };
  std::vector<Config> configs;  // crossed with the grid; none: one unnamed configuration
  struct Axis {
    std::string key;
    std::vector<std::string> values;
  };
  std::vector<Axis> grid;
  std::vector<double> rates;  // rates mode
  std::optional<CapacitySpec> capacity;
  std::optional<CostSpec> cost;  // capacity searches only
  std::string rate_key;  // requests.arrival.rate, or requests.trace.rate_scale for a trace
};

struct SweepPoint {
  int64_t index = 0;
  std::string name;              // configuration name and grid values
  std::vector<Override> params;  // what this point sets: the configuration's keys, then the grid's
  std::string workload_yaml;     // resolved (tandem validate's output), the rate not yet set
  std::string key;               // hash of build, workload, referenced files' contents and mode
};

// Parse and check a sweep file; errors name file:line:column and the field (exit 2).
SweepSpec load_sweep(const std::string& path);
// Every point, each one's workload loaded and checked (a grid value that makes a bad workload
// is reported at its line in the sweep file).
std::vector<SweepPoint> expand_points(const SweepSpec& spec);

// The plan: the spec's mode and every point, self-contained (plan.json).
nlohmann::json plan_json(const SweepSpec& spec, const std::vector<SweepPoint>& points);
// A plan read back; throws InputError naming the file for anything malformed.
struct SweepPlan {
  std::string sweep_path, workload_path, rate_key;
  std::string build;  // the build that planned (build_id()): its points' keys hash it
  std::vector<double> rates;
  std::optional<CapacitySpec> capacity;
  std::optional<CostSpec> cost;
  std::vector<std::string> param_keys;  // every key any point sets, in first-seen order
  std::vector<SweepPoint> points;
};
SweepPlan read_plan(const std::string& plan_path);
SweepPlan plan_from(const SweepSpec& spec, std::vector<SweepPoint> points);
// The keys of the points at `indices` as this build computes them (its build, the files' contents
// here), never copied from plan.json: a result then says which build ran it.
void rekey_points(SweepPlan& plan, const std::vector<int64_t>& indices);

// The hardware a point's workload runs on: the workload's, and in 1P1D each instance's own.
std::vector<std::string> hardware_names(const Workload& w);

// Example prices ($ per GPU-hour) for the hardware presets, used where a sweep's cost: section
// gives none, and labelled as examples wherever shown: an order of magnitude of 2026 on-demand
// cloud prices for an H200 (the PCIe card a little lower), not quotes.
inline constexpr std::array<std::pair<const char*, double>, 3> kExampleGpuHourUsd = {
    {{"h200", 3.5}, {"h200-pcie", 3.0}, {"h200-datasheet", 3.5}}};

// Identity of the running binary (XXH3 of its file), part of every point's key.
std::string build_id();

}  // namespace tandem
