// Analytical roofline cost model: each part of a step takes the longer of its bytes over
// memory bandwidth and its FLOPs over the matrix rate. The formula is written out in
// reports/stage1-continuous-batching/design.md.
#pragma once
#include <memory>

#include "backend/executor.h"
#include "backend/specs.h"

namespace tandem {

class AnalyticalCostModel final : public cost_model_i {
 public:
  // tp > 1: each rank does 1/tp of the layers' work in parallel (the LM head is replicated),
  // plus two all-reduces of the activations per layer over the hardware's link.
  AnalyticalCostModel(const ModelSpec& m, const HardwareSpec& hw, int32_t tp = 1);
  StepCost estimate(const StepPlan& plan) const override;
  std::string inputs() const override;

 private:
  ModelSpec m_;
  HardwareSpec hw_;
  double linear_flops_per_token_, lm_head_flops_per_sample_, weight_bytes_;
  double kv_bytes_per_token_, attn_flops_per_pair_, act_bytes_per_token_;
  int32_t tp_;
};

// Linear model fitted to measured steps of a real backend (see tandem calibrate).
class FittedCostModel final : public cost_model_i {
 public:
  explicit FittedCostModel(const FittedCoefficients& c) : c_(c) {}
  StepCost estimate(const StepPlan& plan) const override;
  std::string inputs() const override;

 private:
  FittedCoefficients c_;
};

// The features both models use: summed over the plan's sequences.
struct PlanFeatures {
  double tokens = 0, seqs = 0, samples = 0;
  double attn_pairs = 0;      // causal (query, key) pairs
  double context_tokens = 0;  // KV positions read (context + new)
};
PlanFeatures plan_features(const StepPlan& plan);

// The fitted model when the hardware spec carries one, else the analytical roofline.
std::unique_ptr<cost_model_i> make_cost_model(const ModelSpec& m, const HardwareSpec& hw, int32_t tp = 1);

// Simulated-time executor: asks a cost model how long the plan takes; samples nothing.
// A cost that is not finite or is longer than kMaxStepSeconds stops the run (an error naming
// the cost model's inputs), never wraps the clock.
class SimExecutor final : public executor_i {
 public:
  explicit SimExecutor(std::unique_ptr<cost_model_i> model) : model_(std::move(model)) {}
  StepResult execute(const StepPlan& plan) override;
  std::string name() const override { return "sim"; }
  bool simulated() const override { return true; }

 private:
  std::unique_ptr<cost_model_i> model_;
};

}  // namespace tandem
