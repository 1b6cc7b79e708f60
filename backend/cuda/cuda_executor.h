// The CUDA backend behind the executor interface. Plain C++: sim/main.cpp includes this
// header only in builds with the CUDA feature on, and no CUDA header comes with it.
#pragma once
#include <cstdint>
#include <memory>

#include "backend/executor.h"
#include "backend/specs.h"
#include "policies/kv_cache.h"
#include "policies/scheduler.h"

namespace tandem::cuda {

// What the executor takes from a workload's engine section (the CLI fills it from
// EngineSpec, whose defaults these repeat).
struct CudaExecutorOptions {
  int32_t kv_blocks = 0;                   // KV cache blocks (engine.resolved_kv_blocks)
  int32_t block_size = kDefaultBlockSize;  // tokens per block (engine.block_size)
  int32_t tp = 1;                          // GPUs device..device+tp-1 (engine.tp)
  int32_t device = 0;                      // the instance's first GPU (a second instance in one process: its own)
  bool deterministic = true;               // pin the GEMM algorithms: batch/chunk-invariant (engine.deterministic)
  bool cuda_graph = true;                  // replay decode steps from captured graphs (engine.cuda_graph)
  bool mma_attention = false;  // attention on the tensor cores (engine.cuda_attention: mma) or CUDA cores (simt)
  int32_t max_step_tokens =
      SchedulerConfig{}.max_num_batched_tokens;            // the largest step (engine.max_num_batched_tokens)
  int32_t max_step_seqs = SchedulerConfig{}.max_num_seqs;  // (engine.max_num_seqs)
};

// Builds the backend for a workload: GPU opt.device (or GPUs device..device+tp-1), checkpoint
// weights if model.checkpoint is set, else dummy bf16 weights generated on the device from the
// seed. Throws InputError for a configuration that cannot run (memory, shapes) and
// std::runtime_error when no usable GPU is present. Its kv_store() moves whole blocks between
// the device cache and host memory (stage 4).
std::unique_ptr<executor_i> make_cuda_executor(ModelSpec& m, uint64_t seed, const CudaExecutorOptions& opt);

class CudaModel;
// The model behind an executor of make_cuda_executor (the device channels, tests); null for any
// other executor.
CudaModel* cuda_model_of(executor_i& exec);

}  // namespace tandem::cuda
