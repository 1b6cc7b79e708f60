#include "backend/cpu/cpu_executor.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>

#include "core/error.h"
#include "core/host.h"

namespace tandem::cpu {

StepResult CpuExecutor::execute(const StepPlan& plan) {
  StepResult r;
  const auto t0 = std::chrono::steady_clock::now();
  model_.forward(plan, plan.tokens, r.sampled);
  r.elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// The per-GPU rule of the KV sizing (sim/workload/config.h, KvCapacity) summed over the ranks, which are
// threads of this one process: the layers' shards add up to the whole model once, the embedding
// and LM head are held once for all ranks, and the KV store holds every rank's share of each block.
CpuMemoryNeed cpu_memory_need(const ModelSpec& m, const CpuExecutorOptions& opt, std::string part) {
  return {.part = std::move(part),
          .model = m.name,
          .weights_bytes = m.params() * 4.0,  // the CPU backend computes and stores fp32
          .kv_bytes = m.kv_bytes_per_token(4) * double(opt.kv_blocks) * opt.block_size,
          .kv_blocks = opt.kv_blocks,
          .block_size = opt.block_size};
}

namespace {
std::string bytes_text(double b) {
  return b >= 1e9 ? fmt::format("{:.3g} GB", b / 1e9) : fmt::format("{:.3g} MB", b / 1e6);
}
}  // namespace

void check_cpu_memory(std::span<const CpuMemoryNeed> parts) {
  const double ram = physical_memory_bytes(), held = resident_memory_bytes();
  double kv = 0, weights = 0;
  for (const CpuMemoryNeed& p : parts) {
    kv += p.kv_bytes;
    weights += p.weights_bytes;
  }
  if (kv <= 0.5 * ram && weights + kv + held <= 0.8 * ram) return;
  if (parts.size() == 1 && parts[0].part.empty()) {  // one instance: its own knobs
    const CpuMemoryNeed& p = parts[0];
    if (kv > 0.5 * ram)
      throw InputError(
          fmt::format("the CPU backend's KV cache would take {:.1f} GB of {:.1f} GB of memory "
                      "({} blocks of {} tokens, fp32): set engine.num_kv_blocks or engine.kv_memory_gb",
                      kv / 1e9, ram / 1e9, p.kv_blocks, p.block_size));
    throw InputError(fmt::format(
        "model '{}' needs {:.1f} GB of fp32 weights and {:.1f} GB of KV cache on the CPU backend, and this process "
        "holds {:.1f} GB already; this machine has {:.1f} GB (use a smaller model, e.g. tiny or llama-100m, or fewer "
        "KV blocks)",
        p.model, weights / 1e9, kv / 1e9, held / 1e9, ram / 1e9));
  }
  std::string each;
  for (const CpuMemoryNeed& p : parts)
    each += fmt::format("{}: weights {} + KV {}, ", p.part, bytes_text(p.weights_bytes), bytes_text(p.kv_bytes));
  throw InputError(fmt::format(
      "the CPU backend's instances would take {} of this machine's {} of memory, {} of it KV ({}held by this process "
      "already: {}); at most half of the memory may be KV and 80% in all: give the instances fewer KV blocks "
      "(engine.num_kv_blocks or engine.kv_memory_gb, disaggregation.prefill.num_kv_blocks, "
      "disaggregation.decode.num_kv_blocks) or use a smaller model",
      bytes_text(weights + kv + held), bytes_text(ram), bytes_text(kv), each, bytes_text(held)));
}

std::unique_ptr<CpuExecutor> make_cpu_executor(ModelSpec& m, uint64_t seed, const CpuExecutorOptions& opt) {
  const int32_t num_blocks = opt.kv_blocks, block_size = opt.block_size, tp = opt.tp;
  const bool deterministic = opt.deterministic;
  const CpuMemoryNeed self = cpu_memory_need(m, opt);
  check_cpu_memory({&self, 1});
  LlamaWeights w = m.checkpoint.empty() ? dummy_weights(m, seed) : load_checkpoint(m.checkpoint, m);
  if (const std::string problem = m.tp_split_problem(tp); !problem.empty())
    throw InputError(fmt::format("engine.tp: {}", problem));
  auto exec = std::make_unique<CpuExecutor>(m, std::move(w), num_blocks, block_size, tp);
  if (!deterministic) exec->model().set_gemm_path(GemmPath::Eigen);  // faster, not batch-invariant
  return exec;
}

}  // namespace tandem::cpu
