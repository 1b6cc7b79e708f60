// Analytical roofline cost model: each part of a step takes the longer of its bytes over
// memory bandwidth and its FLOPs over the matrix rate. The formula is written out in
// reports/stage1-continuous-batching/design.md.
#pragma once
#include <memory>
#include <optional>

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
  double weight_bytes_, kv_bytes_per_token_, act_bytes_per_token_;
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

// Per-operator profile measured on a backend (tandem calibrate --model), interpolated. A
// decode-only step (every sequence one token, sampled) reads the decode table directly; any
// other step is the sum of its operator classes: linear layers by tokens, attention per
// prefill chunk (pairs at the chunk's size) and for its decodes, LM head by sampled rows, and
// the per-sequence step overhead. Then the engine loop's gap, the residual of the step's kind,
// and the idle factor after an idle spell.
class ProfiledCostModel final : public cost_model_i {
 public:
  explicit ProfiledCostModel(std::shared_ptr<const OperatorProfile> p) : p_(std::move(p)) {}
  StepCost estimate(const StepPlan& plan) const override;
  std::string inputs() const override;

 private:
  std::shared_ptr<const OperatorProfile> p_;
};

// The plan a profile's raw step stands for (no block tables: enough to price it).
StepPlan plan_of_profile_step(const ProfileStep& s);

// The step kinds that per-step errors are reported by (steps.csv's n_prefill and n_decode).
enum class StepKind { Decode, Prefill, Mixed };
StepKind step_kind(const StepPlan& plan);
const char* step_kind_name(StepKind k);
// The size a residual is classed by: a decode step's sequences, another step's tokens.
int32_t refine_size(const StepPlan& plan);
// A profile's residual for a step of this kind and size: its size class's, else the nearest kept
// class's, else (no class kept for the kind) its kind's.
double refine_factor(const OperatorProfile& p, StepKind k, int32_t size);

// The features both models use: summed over the plan's sequences.
struct PlanFeatures {
  double tokens = 0, seqs = 0, samples = 0;
  double attn_pairs = 0;      // causal (query, key) pairs
  double context_tokens = 0;  // KV positions read (context + new)
};
PlanFeatures plan_features(const StepPlan& plan);

// The model FLOPs of a step: what the model's math needs for the plan's tokens, whatever runs it
// and however it is split (MFU's numerator, counted as PaLM's appendix B counts it):
//   linear    = 2 x linear_params x tokens              a multiply and an add per weight per token
//   lm_head   = 2 x hidden x vocab x samples            only the rows that sample
//   attention = 4 x layers x heads x head_dim x pairs   QK^T and PV, 2 FLOPs each per (query, key)
//               pair; pairs = PlanFeatures::attn_pairs, the sum over sequences of n x c0 + n (n + 1) / 2
//               (n new tokens after c0 computed: causal)
// Under TP the ranks share these FLOPs (the LM head, computed on every rank, counts once); the
// roofline divides them by the ranks. Norms, RoPE, softmax and the embedding gather are left out.
// The one definition: the analytical cost model prices these FLOPs, the engine sums them for MFU.
struct StepFlops {
  double linear = 0, lm_head = 0, attention = 0;
  double total() const { return linear + lm_head + attention; }
};
StepFlops step_flops(const ModelSpec& m, const PlanFeatures& f);
StepFlops step_flops(const ModelSpec& m, const StepPlan& plan);

// The peak FLOP/s per GPU that MFU divides by: a roofline spec's peak_flops; nullopt for a fitted
// or profiled spec, whose step times are measured and which has no peak.
std::optional<double> mfu_peak_flops(const HardwareSpec& hw);
// Model FLOPs utilisation: `flops` over what `gpus` GPUs of `peak_flops` each do in `seconds`;
// nullopt where no GPU, no peak or no time makes it a figure (never a made-up number).
std::optional<double> model_flops_utilisation(double flops, double seconds, double gpus,
                                              std::optional<double> peak_flops);

// The profiled or fitted model when the hardware spec carries one, else the analytical roofline.
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
