// `tandem calibrate --channel`: measures the workload's KV channel (copy, or tcp to a decode
// worker) on an idle pair of instances, transfers of 1 block up to a quarter of the decode
// cache, and fits time = latency + bytes / bandwidth by least squares. The result is a channel
// profile (disaggregation.channel.profile), so that the simulated backend prices a transfer as
// the measured channel moves it.
#pragma once
#include <string>

#include "sim/executors.h"

namespace tandem {

struct ChannelFit {
  double latency_s = 0, bandwidth_bytes_per_s = 0;
  double max_rel_error = 0;  // of the fit over the measured sizes (medians)
};

// From a served run's transfers (requests.csv of a run with disaggregation): the ones that
// found the link idle, fitted the same way. Learns the channel under the run's own load (CPU
// contention, the other process's steps), as `calibrate --workload` learns step costs.
int calibrate_channel_from_run(const std::string& run_dir, const std::string& out_path);

int calibrate_channel(const std::string& workload, const std::string& backend, const ExecutorFactory* cuda, int threads,
                      int reps, const std::string& out_path);

}  // namespace tandem
