// `tandem calibrate`: measure a real backend's step time over a grid of batch compositions
// and fit the linear cost model (least squares with Eigen) that `hardware: PROFILE.yaml`
// then uses in simulated time.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/cost_model.h"
#include "backend/executor.h"
#include "sim/config.h"

namespace tandem {

struct CalibrationPoint {
  PlanFeatures f;
  double seconds;           // measured
  bool after_idle = false;  // the step started after the backend sat idle
};

// Fits FittedCoefficients on the back-to-back points, minimising the squared relative error;
// coefficients that come out negative are dropped (fixed at zero) and the rest refitted, so
// every term stays physical. idle_factor is the median ratio of the after-idle points'
// time to that fit (1 if there are none).
FittedCoefficients fit_cost_model(const std::vector<CalibrationPoint>& points);
double predict_seconds(const FittedCoefficients& c, const PlanFeatures& f, bool after_idle);

// Backends other than the CPU one, by name, as the CLI builds them for a workload (the CUDA
// backend is its own library, tandem_cuda, which tandem_sim does not link). Live mode (--workload) runs on any of them; grid
// mode (--model) is CPU-only.
using ExecutorFactory = std::function<std::unique_ptr<executor_i>(Workload&)>;
int calibrate_command(const std::vector<std::string>& args, const std::map<std::string, ExecutorFactory>& backends = {});

}  // namespace tandem
