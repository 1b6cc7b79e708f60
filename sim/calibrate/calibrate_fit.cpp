// The older linear fit (`calibrate --workload` alone): least squares on the features of served
// steps, minimising the squared relative error, every coefficient kept non-negative.
#include <Eigen/Dense>
#include <algorithm>
#include <array>

#include "core/error.h"
#include "sim/calibrate/calibrate.h"

#include <fmt/format.h>

namespace tandem {

namespace {
constexpr int kFeatures = 6;  // 1, tokens, seqs, attention pairs, context tokens, samples

Eigen::Matrix<double, 1, kFeatures> row_of(const PlanFeatures& f) {
  Eigen::Matrix<double, 1, kFeatures> r;
  r << 1.0, f.tokens, f.seqs, f.attn_pairs, f.context_tokens, f.samples;
  return r;
}

}  // namespace

double predict_seconds(const FittedCoefficients& c, const PlanFeatures& f, bool after_idle) {
  const double t = c.overhead_s + c.per_token_s * f.tokens + c.per_seq_s * f.seqs + c.per_attn_pair_s * f.attn_pairs +
                   c.per_context_token_s * f.context_tokens + c.per_sample_s * f.samples;
  return after_idle ? t * c.idle_factor : t;
}

FittedCoefficients fit_cost_model(const std::vector<CalibrationPoint>& all) {
  std::vector<CalibrationPoint> points;
  for (const auto& p : all)
    if (!p.after_idle) points.push_back(p);
  if (points.size() < size_t(kFeatures))
    throw InputError(
        fmt::format("calibrate: {} back-to-back steps measured, at least {} are needed to fit: "
                    "give a workload with more requests, or measure on a quieter machine (a step after the "
                    "backend sat idle is left out of the fit, and on busy cores most steps are)",
                    points.size(), kFeatures));
  std::array<bool, kFeatures> active;
  active.fill(true);
  Eigen::VectorXd coef = Eigen::VectorXd::Zero(kFeatures);
  for (int iter = 0; iter < kFeatures; ++iter) {
    std::vector<int> cols;
    for (int j = 0; j < kFeatures; ++j)
      if (active[size_t(j)]) cols.push_back(j);
    Eigen::MatrixXd A(points.size(), cols.size());
    Eigen::VectorXd b(points.size());
    for (size_t i = 0; i < points.size(); ++i) {
      const auto r = row_of(points[i].f);
      const double w = 1.0 / points[i].seconds;  // relative error
      for (size_t k = 0; k < cols.size(); ++k) A(long(i), long(k)) = r(cols[k]) * w;
      b(long(i)) = 1.0;
    }
    const Eigen::VectorXd x = A.colPivHouseholderQr().solve(b);
    coef.setZero();
    bool negative = false;
    for (size_t k = 0; k < cols.size(); ++k) coef(cols[k]) = x(long(k));
    // Drop the most negative coefficient and refit.
    int worst = -1;
    for (size_t k = 0; k < cols.size(); ++k)
      if (x(long(k)) < 0 && (worst < 0 || x(long(k)) < coef(worst))) worst = cols[k];
    if (worst >= 0) {
      active[size_t(worst)] = false;
      negative = true;
    }
    if (!negative) break;
    coef(worst) = 0;
  }
  FittedCoefficients c;
  c.overhead_s = std::max(0.0, coef(0));
  c.per_token_s = std::max(0.0, coef(1));
  c.per_seq_s = std::max(0.0, coef(2));
  c.per_attn_pair_s = std::max(0.0, coef(3));
  c.per_context_token_s = std::max(0.0, coef(4));
  c.per_sample_s = std::max(0.0, coef(5));
  std::vector<double> ratio;
  for (const auto& p : all)
    if (p.after_idle) ratio.push_back(p.seconds / predict_seconds(c, p.f, false));
  c.idle_factor = idle_factor_of(std::move(ratio));  // the profile's rule: 1 with too few samples
  return c;
}

}  // namespace tandem
