// Calibration's parts, which `tandem calibrate` (calibrate_command.h) strings together: the
// linear fit of served steps, the per-operator profile's grid, all-reduces, and the refinement
// of a profile on served steps.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cost_model.h"
#include "backend/cpu/comm.h"
#include "backend/executor.h"
#include "sim/workload/config.h"

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

// The per-operator profile's grid (calibrate_grid.cpp).
struct GridLimits {
  int32_t num_blocks = 0, block_size = 16, max_tokens = 0, max_seqs = 0, max_model_len = 0, vocab = 2;
};
struct GridOptions {
  int reps = 5;                // timed repetitions per shape (the fastest is kept); fewer if the budget says so
  bool quick = false;          // a smaller grid (contexts up to 1,024)
  double budget_s = 0;         // time for the grid (0: no limit)
  bool fill_kv = false;        // write real-looking K/V into the blocks first (GPUs run faster on zeros)
  bool graph_buckets = false;  // decode-only steps are padded to a power of two (CUDA Graphs)
  int idle_rounds = 3;         // after-idle repetitions of the small shapes
  int cpu_threads = 0;         // the CPU backend's threads that compute at once (its CPU share is checked); 0: another backend
};
// A step's all-reduces at tp = comm.size() > 1 (two per layer of tokens x hidden floats), timed
// alone for each token count (the fastest of reps, after a warm run): "allreduce" raw entries.
std::vector<ProfileStep> measure_allreduce(communicator_i& comm, int32_t hidden, int32_t layers,
                                           const std::vector<int32_t>& tokens, int reps);
// Fills c's repeat_* figures from each shape's repetitions (sorted, fastest first) and names.
void repetition_agreement(const std::vector<std::vector<double>>& sorted_times, const std::vector<std::string>& names,
                          CalibrationConditions& c);
// Why a profile measured under these conditions is refused ("" when it is not): a grid that
// waited for its CPU cores, repetitions that disagree at the median shape, or a reference step
// that moved between before and after the grid (the bounds: backend/op_profile.h).
std::string contention_refusal(const CalibrationConditions& c);
// Measures the grid again while contention_refusal() refuses it, up to kGridTries grids in all,
// and returns the last (its conditions.grid_tries says how many were measured). A grid spoiled by
// a spell of other work is not the machine's level; one measured quietly after it is.
OperatorProfile measure_until_agreed(const std::function<OperatorProfile()>& measure_grid,
                                     std::chrono::milliseconds pause = std::chrono::milliseconds(2000));
// The linear fit is refused (exit 3, unless --accept-noisy, which marks the file) when its median
// relative error over the steps it was fitted to is above this: a fit that far off its own steps
// describes the contention, not the backend (reports/simulation-fidelity/report.md, "Measured
// under contention").
constexpr double kFitMedianErrorMax = 0.35;
constexpr int kMinIdleSamples = 8;  // fewer after-idle samples: idle factor 1, and calibrate says so
OperatorProfile measure_operator_profile(executor_i& exec, const GridLimits& limits, const GridOptions& opt);
// Median ratio, clamped to [0.5, 10]; 1 with fewer than kMinIdleSamples ratios.
double idle_factor_of(std::vector<double> ratios);

// A served step: its kind, whether it followed an idle spell, measured time (plus the loop's
// gap to the next step) and what the profile predicts (without residuals or idle factor).
struct ServedStep {
  StepKind kind = StepKind::Decode;
  bool after_idle = false, first = false;
  double measured_s = 0, predicted_s = 0;
  int32_t size = 0;  // refine_size(): a decode step's sequences, another step's tokens
};
constexpr int kMinRefineSteps = 20;  // a residual needs this many steps of its kind, else it stays 1
// Sets the residual per step kind (total measured / total predicted), per size class of each kind
// where a class has kMinRefineSteps steps, and, with enough real idle spells, the idle factor;
// returns a few lines that say what was set and from how many steps.
std::string refine_profile(OperatorProfile& p, const std::vector<ServedStep>& steps, double loop_gap_s);

}  // namespace tandem
