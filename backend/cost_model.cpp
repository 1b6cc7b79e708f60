#include "backend/cost_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>

namespace tandem {

AnalyticalCostModel::AnalyticalCostModel(const ModelSpec& m, const HardwareSpec& hw, int32_t tp)
    : m_(m), hw_(hw), tp_(tp) {
  // Every step streams the linear weights and the LM head; the embedding is only gathered.
  weight_bytes_ = (m.linear_params() + double(m.hidden) * m.vocab) * m.dtype_bytes();
  kv_bytes_per_token_ = m.kv_bytes_per_token();
  // Activations in and out of each layer's GEMMs: small next to the weights, but counted. The
  // MLP's intermediate is written and read once per matrix before down (SwiGLU: gate and up; a
  // two-matrix MLP: up).
  act_bytes_per_token_ = 2.0 * m.layers * (4.0 * m.hidden + (m.mlp_matrices() - 1.0) * m.ffn) * m.dtype_bytes();
}

PlanFeatures plan_features(const StepPlan& plan) {
  PlanFeatures f;
  for (const ScheduledSeq& s : plan.seqs) {
    const double c0 = s.num_computed_before, n = s.num_tokens;
    f.attn_pairs += n * c0 + n * (n + 1) / 2;  // causal: query i sees c0 + i + 1 keys
    f.context_tokens += c0 + n;                // the context is streamed once per step
  }
  f.tokens = plan.num_tokens;
  f.seqs = double(plan.seqs.size());
  f.samples = plan.num_samples;
  return f;
}

StepFlops step_flops(const ModelSpec& m, const PlanFeatures& f) {
  StepFlops fl;
  fl.linear = 2.0 * m.linear_params() * f.tokens;
  fl.lm_head = 2.0 * double(m.hidden) * m.vocab * f.samples;
  fl.attention = 4.0 * m.layers * m.heads * m.head_dim() * f.attn_pairs;
  return fl;
}

StepFlops step_flops(const ModelSpec& m, const StepPlan& plan) { return step_flops(m, plan_features(plan)); }

std::optional<double> mfu_peak_flops(const HardwareSpec& hw) {
  if (hw.fitted || hw.profiled || !(hw.peak_flops > 0)) return std::nullopt;
  return hw.peak_flops;
}

std::optional<double> model_flops_utilisation(double flops, double seconds, double gpus,
                                              std::optional<double> peak_flops) {
  if (!peak_flops || !(*peak_flops > 0) || !(gpus > 0) || !(seconds > 0)) return std::nullopt;
  return flops / (seconds * gpus * *peak_flops);
}

StepCost AnalyticalCostModel::estimate(const StepPlan& plan) const {
  StepCost c;
  if (plan.empty()) return c;
  const PlanFeatures f = plan_features(plan);
  const StepFlops fl = step_flops(m_, f);
  const double kv_tokens_read = f.context_tokens, tokens = f.tokens;
  const double n = tp_, lm_head_bytes = double(m_.hidden) * m_.vocab * m_.dtype_bytes();
  const double gemm_flops = fl.linear / n + fl.lm_head;  // the LM head runs whole on every rank
  const double gemm_bytes = (weight_bytes_ - lm_head_bytes) / n + lm_head_bytes + act_bytes_per_token_ * tokens / n;
  c.gemm_s = std::max(gemm_flops / hw_.peak_flops, gemm_bytes / hw_.mem_bandwidth);
  const double attn_bytes = kv_bytes_per_token_ * (kv_tokens_read + tokens) / n;  // read context, write new
  c.attention_s = std::max(fl.attention / n / hw_.peak_flops, attn_bytes / hw_.mem_bandwidth);
  c.overhead_s = hw_.step_overhead_s;
  if (tp_ > 1) {  // ring all-reduce of T x hidden activations, after attention and after the MLP
    const double bytes = tokens * m_.hidden * m_.dtype_bytes();
    const double one = hw_.link_latency_s + 2.0 * (n - 1) / n * bytes / hw_.link_bandwidth;
    c.comm_s = 2.0 * m_.layers * one;
  }
  return c;
}

StepCost FittedCostModel::estimate(const StepPlan& plan) const {
  StepCost c;
  if (plan.empty()) return c;
  const PlanFeatures f = plan_features(plan);
  c.gemm_s = c_.per_token_s * f.tokens + c_.per_sample_s * f.samples;
  c.attention_s = c_.per_attn_pair_s * f.attn_pairs + c_.per_context_token_s * f.context_tokens;
  c.overhead_s = c_.overhead_s + c_.per_seq_s * f.seqs;
  if (plan.after_idle) {
    c.gemm_s *= c_.idle_factor;
    c.attention_s *= c_.idle_factor;
    c.overhead_s *= c_.idle_factor;
  }
  return c;
}

StepKind step_kind(const StepPlan& plan) {
  if (plan.num_prefill_seqs == 0) return StepKind::Decode;
  return plan.num_decode_seqs == 0 ? StepKind::Prefill : StepKind::Mixed;
}

const char* step_kind_name(StepKind k) {
  return k == StepKind::Decode ? "decode" : k == StepKind::Prefill ? "prefill" : "mixed";
}

int32_t refine_size(const StepPlan& plan) {
  return step_kind(plan) == StepKind::Decode ? int32_t(plan.seqs.size()) : plan.num_tokens;
}

double refine_factor(const OperatorProfile& p, StepKind k, int32_t size) {
  const std::vector<SizeResidual>& by_size = p.refine_by_size[int(k)];
  if (by_size.empty()) return k == StepKind::Decode ? p.refine_decode : k == StepKind::Prefill ? p.refine_prefill : p.refine_mixed;
  // Its own class (u/2, u], else the nearest kept class in powers of two (ties: the smaller). Not
  // the kind's residual: that is a total over every size, weighted towards the commonest, and the
  // residual moves with size (on the CPU 1.55 at one sequence, 1.21 at 9-16).
  const auto class_of = [](int32_t s) { return s <= 1 ? 0 : int(std::ceil(std::log2(double(s)))); };
  const int own = class_of(size);
  const SizeResidual* best = nullptr;
  for (const SizeResidual& c : by_size)
    if (!best || std::abs(class_of(c.upto) - own) < std::abs(class_of(best->upto) - own)) best = &c;
  return best->factor;
}

StepPlan plan_of_profile_step(const ProfileStep& s) {
  StepPlan plan;
  if (s.kind == "mixed") {  // the file records the prompt's size in tokens
    plan.add({0, s.tokens, 0, true, {}}, s.tokens);
    for (int32_t i = 0; i < s.seqs; ++i) plan.add({ReqId(i + 1), 1, s.context, true, {}}, s.context);
  } else {
    const int32_t prompt_len = s.kind == "decode" ? s.context : s.context + s.tokens;
    for (int32_t i = 0; i < s.seqs; ++i) plan.add({ReqId(i), s.tokens, s.context, s.sampled, {}}, prompt_len);
  }
  return plan;
}

void derive_mixed_factor(OperatorProfile& p) {
  p.mixed_factor.clear();
  p.mixed_decodes.clear();
  if (!p.mixed_fit) return;
  // The composition alone: no residuals, no loop gap (the grid's steps have none), no factor.
  auto bare = std::make_shared<OperatorProfile>(p);
  bare->refine_decode = bare->refine_prefill = bare->refine_mixed = 1.0;
  bare->loop_gap_s = 0;
  const ProfiledCostModel composed(bare);
  std::map<double, std::map<double, double>> ratio;  // decodes -> prompt tokens -> measured / composed
  for (const ProfileStep& s : p.raw)
    if (s.kind == "mixed" && !s.idle) {
      const double c = composed.estimate(plan_of_profile_step(s)).total_s();
      if (c > 0) ratio[s.seqs][s.tokens] = s.seconds / c;
    }
  for (const auto& [decodes, by_tokens] : ratio) {
    p.mixed_decodes.push_back(decodes);
    Curve c;
    for (const auto& [tokens, r] : by_tokens) {
      c.x.push_back(tokens);
      c.y.push_back(r);
    }
    p.mixed_factor.push_back(c);
  }
}

double mixed_correction(const OperatorProfile& p, double prefill_tokens, double decodes) {
  if (p.mixed_factor.empty()) return 1.0;
  const auto at = [&](const Curve& c) { return c.at(std::clamp(prefill_tokens, c.x.front(), c.x.back())); };
  const std::vector<double>& k = p.mixed_decodes;
  if (k.size() == 1 || decodes <= k.front()) return at(p.mixed_factor.front());
  if (decodes >= k.back()) return at(p.mixed_factor.back());
  const size_t i = size_t(std::upper_bound(k.begin(), k.end(), decodes) - k.begin());
  const double t = (decodes - k[i - 1]) / (k[i] - k[i - 1]);
  return at(p.mixed_factor[i - 1]) + t * (at(p.mixed_factor[i]) - at(p.mixed_factor[i - 1]));
}

StepCost ProfiledCostModel::estimate(const StepPlan& plan) const {
  StepCost c;
  if (plan.empty()) return c;
  const OperatorProfile& p = *p_;
  const double S = double(plan.seqs.size());
  // The step's one-token sampled sequences: how many, and the context their attention costs.
  // On the GPU the sequences run side by side, each walking its keys in order, so the time
  // follows the longest context (measured on the H200: the grid's decode attention barely
  // grows with the batch, and served batches of mixed lengths took what their longest would);
  // the CPU backend computes them one after another: the mean context, times the batch.
  const bool side_by_side = p.backend == "cuda";
  double dec_seqs = 0, dec_sum_ctx = 0, dec_max_ctx = 0;
  bool decode_shape = true;
  for (const ScheduledSeq& s : plan.seqs) {
    if (s.num_tokens == 1 && s.samples) {
      dec_seqs += 1;
      dec_sum_ctx += s.num_computed_before + 1;
      dec_max_ctx = std::max(dec_max_ctx, double(s.num_computed_before) + 1);
    } else {
      decode_shape = false;
    }
  }
  if (decode_shape) {  // the decode table, as measured (graph replay on CUDA)
    // With CUDA Graphs the step runs padded to the bucket (attention only for real rows).
    const double Sb = p.graph_buckets ? std::exp2(std::ceil(std::log2(S))) : S;
    const double ctx = side_by_side ? dec_max_ctx : dec_sum_ctx / S;
    const double fixed = decode_seconds(p, Sb, 0), full = decode_seconds(p, Sb, ctx);
    c.gemm_s = fixed;
    c.attention_s = std::max(0.0, full - fixed) * (side_by_side ? 1.0 : S / Sb);
  } else {
    c.gemm_s = p.linear.at(plan.num_tokens) + (plan.num_samples > 0 ? p.lm_head.at(plan.num_samples) : 0.0);
    c.overhead_s = p.seq_overhead.at(S);
    for (const ScheduledSeq& s : plan.seqs)
      if (!(s.num_tokens == 1 && s.samples)) {
        const double n = s.num_tokens;
        c.attention_s += p.prefill_attn.at(n) * n * (s.num_computed_before + (n + 1) / 2);
      }
    if (dec_seqs > 0)
      c.attention_s += std::max(0.0, decode_seconds(p, dec_seqs, side_by_side ? dec_max_ctx : dec_sum_ctx / dec_seqs) -
                                         decode_seconds(p, dec_seqs, 0));
  }
  // The all-reduces were measured inside the steps (linear work, the decode table) and on their
  // own by size: shown apart, taken out of the linear work so that the total stays as measured.
  if (!p.allreduce.empty()) {
    c.comm_s = std::min(c.gemm_s, p.allreduce.at(plan.num_tokens));
    c.gemm_s -= c.comm_s;
  }
  const StepKind k = step_kind(plan);
  if (k == StepKind::Mixed && !p.mixed_factor.empty()) {
    // The measured composition correction at this step's prefill tokens and decodes (on the CPU
    // the composition's error grew with the decodes: -5 % at 1, -13 % at 20 and more).
    double prefill_tokens = 0;
    for (const ScheduledSeq& s : plan.seqs)
      if (!(s.num_tokens == 1 && s.samples)) prefill_tokens += s.num_tokens;
    const double r = mixed_correction(p, prefill_tokens, dec_seqs);
    c.gemm_s *= r;
    c.attention_s *= r;
    c.overhead_s *= r;
    c.comm_s *= r;
  }
  c.overhead_s += p.loop_gap_s;
  double f = refine_factor(p, k, refine_size(plan));
  if (plan.after_idle) f *= p.idle_factor;
  c.gemm_s *= f;
  c.attention_s *= f;
  c.overhead_s *= f;
  c.comm_s *= f;
  return c;
}

std::string ProfiledCostModel::inputs() const {
  const OperatorProfile& p = *p_;
  return fmt::format("profiled ({} on '{}', measured on {} at {}): {} raw steps, idle_factor {:.6g}", p.backend,
                     p.model, p.hardware, p.code_version, p.raw.size(), p.idle_factor);
}

std::string AnalyticalCostModel::inputs() const {
  std::string s = fmt::format("hardware '{}': peak_tflops {:.6g}, mem_bandwidth_tbs {:.6g}, step_overhead_us {:.6g}",
                              hw_.name, hw_.peak_flops / 1e12, hw_.mem_bandwidth / 1e12, hw_.step_overhead_s * 1e6);
  if (tp_ > 1)
    s += fmt::format(", link_bandwidth_gbs {:.6g}, link_latency_us {:.6g} (tp {})", hw_.link_bandwidth / 1e9,
                     hw_.link_latency_s * 1e6, tp_);
  return s + fmt::format("; model '{}'", m_.name);
}

std::string FittedCostModel::inputs() const {
  return fmt::format(
      "fitted profile ({} on '{}'): overhead_us {:.6g}, per_token_us {:.6g}, per_seq_us {:.6g}, "
      "per_attn_pair_ns {:.6g}, per_context_token_ns {:.6g}, per_sample_us {:.6g}, idle_factor {:.6g}",
      c_.backend, c_.model, c_.overhead_s * 1e6, c_.per_token_s * 1e6, c_.per_seq_s * 1e6, c_.per_attn_pair_s * 1e9,
      c_.per_context_token_s * 1e9, c_.per_sample_s * 1e6, c_.idle_factor);
}

std::unique_ptr<cost_model_i> make_cost_model(const ModelSpec& m, const HardwareSpec& hw, int32_t tp) {
  if (hw.profiled) return std::make_unique<ProfiledCostModel>(hw.profiled);
  if (hw.fitted) return std::make_unique<FittedCostModel>(*hw.fitted);
  return std::make_unique<AnalyticalCostModel>(m, hw, tp);
}

StepResult SimExecutor::execute(const StepPlan& plan) {
  StepResult r;
  r.cost = model_->estimate(plan);
  const double total = r.cost.total_s();
  if (!std::isfinite(total) || total < 0 || total > kMaxStepSeconds)
    throw std::runtime_error(
        fmt::format("the cost model charges {:.6g} s for a step of {} tokens over {} sequences (gemm {:.6g} s, "
                    "attention {:.6g} s, overhead {:.6g} s, communication {:.6g} s); the simulator takes "
                    "steps of at most {:.0g} s: the inputs are too slow for this model ({})",
                    total, plan.num_tokens, plan.seqs.size(), r.cost.gemm_s, r.cost.attention_s, r.cost.overhead_s,
                    r.cost.comm_s, kMaxStepSeconds, model_->inputs()));
  r.elapsed = std::max<Duration>(1, from_seconds(total));
  return r;
}

}  // namespace tandem
