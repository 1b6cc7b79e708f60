// The swappable part that runs a step: a cost model (simulated time) or a real backend.
#pragma once
#include <string>

#include "policies/plan.h"

namespace tandem {

class cost_model_i {
 public:
  virtual ~cost_model_i() = default;
  virtual StepCost estimate(const StepPlan& plan) const = 0;
  // The inputs its costs come from (the hardware numbers or fitted coefficients), for messages.
  virtual std::string inputs() const { return {}; }
};

class executor_i {
 public:
  virtual ~executor_i() = default;
  virtual StepResult execute(const StepPlan& plan) = 0;
  virtual std::string name() const = 0;
  // True if elapsed times are modelled (virtual clock); false if measured (wall clock).
  virtual bool simulated() const = 0;
  // True if the plan must carry input token ids (StepPlan::tokens).
  virtual bool needs_tokens() const { return !simulated(); }
};

}  // namespace tandem
