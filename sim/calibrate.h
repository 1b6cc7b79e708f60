// `tandem calibrate`: measure a real backend's step time over a grid of batch compositions
// and fit the linear cost model (least squares with Eigen) that `hardware: PROFILE.yaml`
// then uses in simulated time.
#pragma once
#include <string>
#include <vector>

#include "backend/cost_model.h"

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

int calibrate_command(const std::vector<std::string>& args);

}  // namespace tandem
