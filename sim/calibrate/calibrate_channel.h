// `tandem calibrate --channel`: measures the workload's KV channel (copy, or tcp to a decode
// worker) on an idle pair of instances, transfers of 1 block up to the workload's longest prompt
// (at most a quarter of the decode cache), two sizes a doubling, and writes a table of the
// median time per size (with each size's spread), so that the simulated backend prices a
// transfer as the measured channel moved it. The least-squares line time = latency + bytes /
// bandwidth is printed beside it: a real channel rarely follows one (caches).
#pragma once
#include <string>
#include <vector>

#include "sim/run/executors.h"

namespace tandem {

// One size of an idle channel's calibration: the median of its repetitions and their spread
// (interquartile range / median: a stray slow repetition, a page fault or another process, does
// not make a size look noisy).
struct SizePoint {
  int32_t blocks = 0;
  double bytes = 0, median_s = 0, spread = 0;
};

// The medians of `table`, made non-decreasing in size (a larger transfer does not take less
// time) by pooling adjacent violators: a decreasing run of sizes gets its mean, so one slow
// size does not lift every larger one, as a running maximum would. What the profile's table holds.
std::vector<double> non_decreasing(const std::vector<SizePoint>& table);

struct ChannelFit {
  double latency_s = 0, bandwidth_bytes_per_s = 0;
  double max_rel_error = 0;  // of the fit over the measured sizes (medians)
};

// From a served run's transfers (requests.csv of a run with disaggregation): the ones that
// found the link idle, fitted the same way. Learns the channel under the run's own load (CPU
// contention, the other process's steps), as `calibrate --workload` learns step costs.
// A run whose summary.json warned that other work took its cores is refused (exit 3) unless
// accept_noisy, which marks the file; its conditions go into the file either way.
int calibrate_channel_from_run(const std::string& run_dir, const std::string& out_path, bool accept_noisy = false);

// The table is judged by its repetitions: when the median over the sizes of their spread (IQR /
// median) is above kChannelSpreadMax, the machine moved the transfers more than the sizes do, and
// the table is refused (exit 3) unless accept_noisy, which marks the file (what it saw:
// reports/simulation-fidelity/report.md, "Measured under contention").
constexpr double kChannelSpreadMax = 0.50;
int calibrate_channel(const std::string& workload, const std::vector<Override>& sets, const std::string& backend,
                      const ExecutorFactory* cuda, int threads, int reps, const std::string& out_path,
                      bool accept_noisy = false);

}  // namespace tandem
