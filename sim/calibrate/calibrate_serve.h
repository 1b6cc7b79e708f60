// Serving real traffic for calibration: every step of a real run of a workload on its backend,
// in real time, as the engine makes them (with its gaps between steps and its mix of shapes).
#pragma once
#include <memory>
#include <vector>

#include "backend/executor.h"
#include "backend/warmup.h"
#include "sim/calibrate/calibrate.h"
#include "sim/run/executors.h"

namespace tandem {

struct ServedRun {
  std::vector<CalibrationPoint> points;  // seconds: to the next step's start (or + the median gap)
  std::vector<ServedStep> steps;
  double loop_gap_s = 0;
};

// A backend's factory is given for cuda only; cpu is built here.
std::unique_ptr<executor_i> executor_for(Workload& w, const ExecutorFactory* factory);
// The workload served on the backend of `factory` (none: cpu) under the wall clock, set up as
// `tandem run` sets up a run (sim/run/run_setup.h), warm-up first. With `predictor`, each step's
// prediction is kept too.
ServedRun serve(Workload w, const ExecutorFactory* factory, const cost_model_i* predictor);

}  // namespace tandem
