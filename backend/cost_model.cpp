#include "backend/cost_model.h"

#include <algorithm>

namespace tandem {

AnalyticalCostModel::AnalyticalCostModel(const ModelSpec& m, const HardwareSpec& hw) : m_(m), hw_(hw) {
  linear_flops_per_token_ = 2.0 * m.linear_params();
  lm_head_flops_per_sample_ = 2.0 * double(m.hidden) * m.vocab;
  // Every step streams the linear weights and the LM head; the embedding is only gathered.
  weight_bytes_ = (m.linear_params() + double(m.hidden) * m.vocab) * m.dtype_bytes();
  kv_bytes_per_token_ = m.kv_bytes_per_token();
  // QK^T and PV: 2 FLOPs each per (query, key) pair, per head dim, per head, per layer.
  attn_flops_per_pair_ = 4.0 * m.layers * m.heads * m.head_dim();
  // Activations in and out of each layer's GEMMs: small next to the weights, but counted.
  act_bytes_per_token_ = 2.0 * m.layers * (4.0 * m.hidden + 2.0 * m.ffn) * m.dtype_bytes();
}

StepCost AnalyticalCostModel::estimate(const StepPlan& plan) const {
  StepCost c;
  if (plan.empty()) return c;
  double pairs = 0, kv_tokens_read = 0;
  for (const ScheduledSeq& s : plan.seqs) {
    const double c0 = s.n_computed_before, n = s.n_tokens;
    pairs += n * c0 + n * (n + 1) / 2;  // causal: query i sees c0 + i + 1 keys
    kv_tokens_read += c0 + n;           // the context is streamed once per step
  }
  const double tokens = plan.n_tokens, samples = plan.n_samples;
  const double gemm_flops = linear_flops_per_token_ * tokens + lm_head_flops_per_sample_ * samples;
  const double gemm_bytes = weight_bytes_ + act_bytes_per_token_ * tokens;
  c.gemm_s = std::max(gemm_flops / hw_.peak_flops, gemm_bytes / hw_.mem_bandwidth);
  const double attn_bytes = kv_bytes_per_token_ * (kv_tokens_read + tokens);  // read context, write new
  c.attention_s = std::max(attn_flops_per_pair_ * pairs / hw_.peak_flops, attn_bytes / hw_.mem_bandwidth);
  c.overhead_s = hw_.step_overhead_s;
  return c;
}

StepResult SimExecutor::execute(const StepPlan& plan) {
  StepResult r;
  r.cost = model_->estimate(plan);
  r.elapsed = std::max<Duration>(1, from_seconds(r.cost.total_s()));
  return r;
}

}  // namespace tandem
