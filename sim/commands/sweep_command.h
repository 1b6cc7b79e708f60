// `tandem sweep`: many simulated runs of one workload over a grid of knobs, each at given
// arrival rates or searched for its capacity under an SLO. README, "Sweeps".
#pragma once
#include <string>
#include <vector>

namespace tandem {
// `tandem sweep SWEEP.yaml`, `sweep plan`, `sweep run`, `sweep collect`. Returns the exit status.
int sweep_command(const std::vector<std::string>& args);
}  // namespace tandem
