// `tandem calibrate`: measure a real backend's step times and write the hardware profile that
// `hardware: PROFILE.yaml` then uses in simulated time. --model: the per-operator profile (a
// grid of synthetic step shapes, interpolated; refined on served traffic with --workload).
// --workload alone: the older linear fit (least squares with Eigen) on served steps.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "sim/run/executors.h"

namespace tandem {

// Backends other than the CPU one, by name, as the CLI builds them for a workload (the CUDA
// backend is a loadable module, which tandem_sim reaches only through cuda_executor_factory()). Live mode (--workload)
// runs on any of them; grid mode (--model) is CPU-only.
int calibrate_command(const std::vector<std::string>& args,
                      const std::map<std::string, ExecutorFactory>& backends = {});

}  // namespace tandem
