// Refining a per-operator profile on served traffic: a residual per step kind, and the idle
// factor from real idle spells.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>

#include "sim/calibrate/calibrate.h"

namespace tandem {

namespace {
int32_t size_class(int32_t size) {  // the power of two at or above it: classes (1], (1, 2], (2, 4], ...
  int32_t upto = 1;
  while (upto < size && upto < (1 << 30)) upto *= 2;
  return upto;
}

// Within a kind the grid's error is not one number (on the CPU, one-sequence decodes were priced
// 24-27 % high and two-sequence ones 24-26 % low, in two workloads alike, so one residual for
// every decode fit neither): each size class with enough back-to-back steps gets its own.
std::string refine_by_size(OperatorProfile& p, const std::vector<ServedStep>& steps, double loop_gap_s) {
  std::map<int32_t, std::array<double, 3>> classes[3];  // upto -> {measured, predicted, steps}
  for (const ServedStep& s : steps) {
    if (s.predicted_s <= 0 || s.first || s.after_idle || s.size <= 0) continue;
    std::array<double, 3>& c = classes[int(s.kind)][size_class(s.size)];
    c[0] += s.measured_s;
    c[1] += s.predicted_s + loop_gap_s;
    c[2] += 1;
  }
  std::string out;
  for (int k = 0; k < 3; ++k) {
    p.refine_by_size[k].clear();
    std::string kept;
    for (const auto& [upto, c] : classes[k]) {
      if (c[2] < kMinRefineSteps) continue;
      p.refine_by_size[k].push_back({upto, std::clamp(c[0] / c[1], 0.25, 4.0), int32_t(c[2])});
      kept += fmt::format("{}{}: {:.4f} ({})", kept.empty() ? "" : ", ", upto, p.refine_by_size[k].back().factor,
                          int32_t(c[2]));
    }
    if (!kept.empty())
      out += fmt::format("residual {} by size ({} up to: residual (steps)): {}\n", step_kind_name(StepKind(k)),
                         k == int(StepKind::Decode) ? "sequences" : "tokens", kept);
  }
  return out;
}
}  // namespace

std::string refine_profile(OperatorProfile& p, const std::vector<ServedStep>& steps, double loop_gap_s) {
  p.loop_gap_s = loop_gap_s;
  // Totals, not a median of ratios: TTFT and TPOT are means over requests, and on a shared
  // machine the steps have a heavy tail (a step preempted for a time slice): a median stays near
  // the grid while the total, which the means follow, does not (reports/before-stage4/report.md).
  double meas[3] = {0, 0, 0}, pred[3] = {0, 0, 0}, idle_meas = 0;
  int count[3] = {0, 0, 0}, idle = 0;
  for (const ServedStep& s : steps) {
    if (s.predicted_s <= 0 || s.first) continue;  // the first step follows the warm-up's own spell
    if (s.after_idle) {
      idle_meas += s.measured_s;
      ++idle;
      continue;
    }
    meas[int(s.kind)] += s.measured_s;
    pred[int(s.kind)] += s.predicted_s + loop_gap_s;
    ++count[int(s.kind)];
  }
  std::string out;
  double* target[3] = {&p.refine_decode, &p.refine_prefill, &p.refine_mixed};
  // A kind with too few served steps of its own takes the pooled residual of all back-to-back
  // steps: the contention level they saw applies to it too, and the grid alone (residual 1)
  // under-predicted such steps (prefill-only steps follow idle spells, so calibration traffic
  // has almost none back to back: reports/simulation-fidelity/report.md).
  const int pooled_count = count[0] + count[1] + count[2];
  const double pooled = pooled_count >= kMinRefineSteps
                            ? std::clamp((meas[0] + meas[1] + meas[2]) / (pred[0] + pred[1] + pred[2]), 0.25, 4.0)
                            : 1.0;
  p.refine_steps = 0;
  for (int k = 0; k < 3; ++k) {
    const char* name = step_kind_name(StepKind(k));
    if (count[k] < kMinRefineSteps) {
      *target[k] = pooled;
      out += pooled_count >= kMinRefineSteps
                 ? fmt::format("residual {}: {:.4f}, pooled over the {} back-to-back steps of every kind ({} of "
                               "this kind, {} needed for its own)\n",
                               name, pooled, pooled_count, count[k], kMinRefineSteps)
                 : fmt::format("residual {}: 1 ({} back-to-back steps of this kind and {} of every kind, {} needed)\n",
                               name, count[k], pooled_count, kMinRefineSteps);
      continue;
    }
    *target[k] = std::clamp(meas[k] / pred[k], 0.25, 4.0);
    p.refine_steps += count[k];
    out += fmt::format("residual {}: {:.4f} (total measured / predicted over {} steps)\n", name, *target[k], count[k]);
  }
  out += refine_by_size(p, steps, loop_gap_s);
  // After-idle steps of served traffic (real idle spells, of every length) replace the grid's
  // 20 ms sleeps, when there are enough of them; relative to the back-to-back prediction of
  // the same steps, residuals included.
  if (idle >= kMinIdleSamples) {
    double refined = 0;  // idle_pred, with each step's residual
    for (const ServedStep& s : steps)
      if (s.after_idle && s.predicted_s > 0 && !s.first) refined += (s.predicted_s + loop_gap_s) * refine_factor(p, s.kind, s.size);
    p.idle_factor = std::clamp(idle_meas / refined, 0.5, 10.0);
    p.idle_samples = idle;
    out += fmt::format("idle factor: {:.4f} from {} after-idle served steps\n", p.idle_factor, idle);
  } else {
    out += fmt::format(
        "idle factor: {:.4f} kept from the grid ({} samples); served traffic had {} after-idle steps, "
        "{} needed\n",
        p.idle_factor, p.idle_samples, idle, kMinIdleSamples);
  }
  return out;
}

}  // namespace tandem
