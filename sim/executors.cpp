#include "sim/executors.h"

#include <fmt/format.h>

#include "backend/cost_model.h"

namespace tandem {

cpu::CpuExecutorOptions cpu_executor_options(const EngineSpec& e) {
  return {.kv_blocks = e.resolved_kv_blocks, .block_size = e.block_size, .tp = e.tp, .deterministic = e.deterministic};
}

std::unique_ptr<executor_i> make_executor(Workload& w, const std::string& backend, const ExecutorFactory* cuda) {
  if (backend == "sim") return std::make_unique<SimExecutor>(make_cost_model(w.model, w.hardware, w.engine.tp));
  if (backend == "cpu") return cpu::make_cpu_executor(w.model, w.seed, cpu_executor_options(w.engine));
  if (backend == "cuda") {
    if (!cuda)
      throw InputError(
          "--backend cuda: this build has no CUDA backend (configure with -Dcuda=enabled where nvcc, "
          "cuBLAS and NCCL are installed)");
    return (*cuda)(w);
  }
  throw InputError(fmt::format("--backend {}: unknown (known: sim, cpu, cuda)", backend));
}

WarmUpShape warm_up_shape(const Workload& w) {
  return {w.engine.resolved_kv_blocks, w.engine.block_size, w.engine.max_num_batched_tokens, w.engine.max_num_seqs,
          w.model.max_model_len};
}

}  // namespace tandem
