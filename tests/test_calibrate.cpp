// The fitted cost model: least squares recovers known coefficients, keeps them physical,
// and a profile file drives simulated time.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "backend/cost_model.h"
#include "core/rng.h"
#include "sim/calibrate/calibrate.h"
#include "sim/calibrate/calibrate_channel.h"
#include "sim/workload/config.h"

using namespace tandem;

TEST_CASE("fit_cost_model recovers the coefficients of exactly linear data") {
  FittedCoefficients truth;
  truth.overhead_s = 300e-6;
  truth.per_token_s = 40e-6;
  truth.per_seq_s = 5e-6;
  truth.per_attn_pair_s = 2e-9;
  truth.per_context_token_s = 30e-9;
  truth.per_sample_s = 20e-6;
  Rng rng(1);
  std::vector<CalibrationPoint> pts;
  for (int i = 0; i < 60; ++i) {
    PlanFeatures f;
    f.seqs = double(rng.uniform_int(1, 64));
    f.samples = std::floor(f.seqs * rng.uniform());
    f.tokens = f.seqs + double(rng.uniform_int(0, 2000));
    f.context_tokens = f.tokens + double(rng.uniform_int(0, 30000));
    f.attn_pairs = f.tokens * double(rng.uniform_int(1, 3000));
    const double t = truth.overhead_s + truth.per_token_s * f.tokens + truth.per_seq_s * f.seqs +
                     truth.per_attn_pair_s * f.attn_pairs + truth.per_context_token_s * f.context_tokens +
                     truth.per_sample_s * f.samples;
    pts.push_back({f, t});
  }
  const FittedCoefficients c = fit_cost_model(pts);
  CHECK(c.overhead_s == doctest::Approx(truth.overhead_s).epsilon(1e-6));
  CHECK(c.per_token_s == doctest::Approx(truth.per_token_s).epsilon(1e-6));
  CHECK(c.per_seq_s == doctest::Approx(truth.per_seq_s).epsilon(1e-6));
  CHECK(c.per_attn_pair_s == doctest::Approx(truth.per_attn_pair_s).epsilon(1e-6));
  CHECK(c.per_context_token_s == doctest::Approx(truth.per_context_token_s).epsilon(1e-6));
  CHECK(c.per_sample_s == doctest::Approx(truth.per_sample_s).epsilon(1e-6));
}

TEST_CASE("fit_cost_model drops terms that would come out negative, and refits the others") {
  // Time falls with the number of sequences (tokens and sequences vary independently): the
  // unconstrained fit has per_seq < 0. The fit must keep every coefficient >= 0 and, having
  // dropped the negative terms, fit the others again: a least-squares fit on the terms it keeps,
  // so its weighted residuals are orthogonal to each kept column. Clamping the negative term to
  // 0 without the refit leaves the others fitted for it, and every step comes out too slow.
  std::vector<CalibrationPoint> pts;
  for (int i = 0; i < 40; ++i) {
    PlanFeatures f;
    f.seqs = 1 + i / 5;
    f.samples = f.seqs;
    f.tokens = 100.0 * (1 + i % 5);
    f.context_tokens = f.tokens;
    f.attn_pairs = f.tokens;
    pts.push_back({f, 1e-3 + 1e-5 * f.tokens - 2e-5 * f.seqs});
  }
  const FittedCoefficients c = fit_cost_model(pts);
  for (double v : {c.overhead_s, c.per_token_s, c.per_seq_s, c.per_attn_pair_s, c.per_context_token_s, c.per_sample_s})
    CHECK(v >= 0);
  CHECK(c.per_seq_s == 0);
  CHECK(c.per_sample_s == 0);
  REQUIRE(c.overhead_s > 0);
  // The fit minimises relative error: rows weighted by 1/t. Residual r_i = pred_i / t_i - 1.
  double dot_overhead = 0, dot_tokens = 0, norm = 0, worst = 0;
  for (const CalibrationPoint& p : pts) {
    const double r = predict_seconds(c, p.f, false) / p.seconds - 1, w = 1 / p.seconds;
    dot_overhead += r * w;
    dot_tokens += r * w * p.f.tokens;
    norm += w;
    worst = std::max(worst, std::fabs(r));
  }
  CHECK(std::fabs(dot_overhead) / norm < 1e-9);
  CHECK(std::fabs(dot_tokens) / (norm * 300) < 1e-9);
  CHECK(worst < 0.1);  // and the kept terms still describe the data
}

TEST_CASE("a hardware profile with fitted coefficients drives the cost model, for its model only") {
  const std::string prof = R"(model: tiny
hardware:
  name: p
  memory_gb: 24
  fitted: {backend: cpu, model: tiny, threads: 2, overhead_us: 100, per_token_us: 10, per_seq_us: 1,
           per_attn_pair_ns: 1, per_context_token_ns: 2, per_sample_us: 3}
engine: {num_kv_blocks: 100}
requests: {count: 1, arrival: {process: burst}, prompt_len: 10, output_len: 2}
)";
  Workload w = parse_workload(prof, "w.yaml");
  REQUIRE(w.hardware.fitted);
  auto model = make_cost_model(w.model, w.hardware);
  StepPlan p;
  p.add({0, 10, 0, true, {}}, 10);
  // 100 + 10*10 + 1*1 + 55 pairs*1ns + 10 ctx*2ns + 3 = 204.075 us
  CHECK(model->estimate(p).total_s() == doctest::Approx(204.075e-6).epsilon(1e-9));
  std::string other = prof;
  other.replace(0, 11, "model: llama3-8b");
  try {
    parse_workload(other, "w.yaml");
    FAIL("expected an error");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("fitted on model 'tiny'") != std::string::npos);
  }
}

TEST_CASE("a channel table's medians are made non-decreasing by pooling adjacent violators, not a running maximum") {
  const auto pts = [](std::initializer_list<double> s) {
    std::vector<SizePoint> t;
    int32_t b = 1;
    for (double v : s) t.push_back({b, double(b) * 1000, v, 0}), b *= 2;
    return t;
  };
  CHECK(non_decreasing(pts({1, 2, 3})) == std::vector<double>{1, 2, 3});
  // One slow size (8) between 2 and 3: pooled with the sizes it exceeds, not lifting all after it.
  CHECK(non_decreasing(pts({1, 8, 2, 3, 10})) == std::vector<double>{1, 13.0 / 3, 13.0 / 3, 13.0 / 3, 10});
  CHECK(non_decreasing(pts({4, 2})) == std::vector<double>{3, 3});
}
