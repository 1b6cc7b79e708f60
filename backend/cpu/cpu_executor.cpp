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

std::unique_ptr<CpuExecutor> make_cpu_executor(ModelSpec& m, uint64_t seed, const CpuExecutorOptions& opt) {
  const int32_t num_blocks = opt.kv_blocks, block_size = opt.block_size, tp = opt.tp;
  const bool deterministic = opt.deterministic;
  const double kv_bytes = m.kv_bytes_per_token(4) * double(num_blocks) * block_size;  // fp32, all ranks
  const double ram = physical_memory_bytes();
  if (kv_bytes > 0.5 * ram)
    throw InputError(
        fmt::format("the CPU backend's KV cache would take {:.1f} GB of {:.1f} GB of memory "
                    "({} blocks of {} tokens, fp32): set engine.num_kv_blocks or engine.kv_memory_gb",
                    kv_bytes / 1e9, ram / 1e9, num_blocks, block_size));
  check_fits_in_memory(m, kv_bytes);
  LlamaWeights w = m.checkpoint.empty() ? dummy_weights(m, seed) : load_checkpoint(m.checkpoint, m);
  if (const std::string problem = m.tp_split_problem(tp); !problem.empty())
    throw InputError(fmt::format("engine.tp: {}", problem));
  auto exec = std::make_unique<CpuExecutor>(m, std::move(w), num_blocks, block_size, tp);
  if (!deterministic) exec->model().set_gemm_path(GemmPath::Eigen);  // faster, not batch-invariant
  return exec;
}

}  // namespace tandem::cpu
