// The CUDA backend as a loadable module (tandem-cuda.so, built beside the tandem binary with the
// cuda feature): the one boundary between the executable and the backend/cuda code, and the
// loader that dlopen()s it on first need. cuBLAS, cuBLASLt, NCCL and cudart are the module's
// dependencies, not the executable's, so a command that never builds a CUDA executor never maps
// them. Plain C++: no CUDA header comes with it (sim/ includes it).
//
// Symbols: the executable is linked with every object of the backend and policies layers and
// exports its symbols (-rdynamic); the module holds backend/cuda alone and leaves the lower
// layers' symbols undefined, bound to the executable's at load time. So there is one copy of
// every backend global, and an exception the module throws (InputError, std::runtime_error) is
// caught by sim/commands/main.cpp's handlers as one thrown there.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/executor.h"
#include "backend/specs.h"
#include "backend/transfer/channel.h"
#include "policies/kv_cache.h"
#include "policies/scheduler.h"

namespace tandem {

namespace cuda {
// What the CUDA executor takes from a workload's engine section (sim/run/executors.cpp fills it from
// EngineSpec, whose defaults these repeat).
struct CudaExecutorOptions {
  int32_t kv_blocks = 0;                   // KV cache blocks (engine.resolved_kv_blocks)
  int32_t block_size = kDefaultBlockSize;  // tokens per block (engine.block_size)
  int32_t tp = 1;                          // GPUs device..device+tp-1 (engine.tp)
  int32_t device = 0;                      // the instance's first GPU (a second instance in one process: its own)
  bool deterministic = true;               // pin the GEMM algorithms: batch/chunk-invariant (engine.deterministic)
  bool cuda_graph = true;                  // replay decode steps from captured graphs (engine.cuda_graph)
  // engine.cuda_attention: 0 simt (CUDA cores), 1 mma (tensor cores), 2 split (split-KV, CUDA cores),
  // 3 mma_split (split-KV, tensor cores)
  int32_t attention = 0;
  int32_t row_kernels = 1;  // engine.cuda_row_kernels: 1 (v1) or 2 (v2: loads first, the same bits)
  bool own_gemm = false;    // engine.cuda_gemm: own (the own tensor-core GEMM for every shape) or pinned
  int32_t max_step_tokens =
      SchedulerConfig{}.max_num_batched_tokens;            // the largest step (engine.max_num_batched_tokens)
  int32_t max_step_seqs = SchedulerConfig{}.max_num_seqs;  // (engine.max_num_seqs)
};
}  // namespace cuda

// The module's version of this boundary. Bump it whenever CudaModuleApi, CudaExecutorOptions or
// anything they pass by reference changes shape: the loader refuses a module of another version
// (a stale tandem-cuda.so beside a newer binary) instead of calling into it.
// 2: CudaExecutorOptions.attention (was bool mma_attention); 3: kv_channel_i::abort takes the abort time;
// 4: ModelSpec (passed to make_executor) gained mlp and positions.
constexpr uint32_t kCudaModuleAbi = 4;
constexpr const char* kCudaModuleEntry = "tandem_cuda_module";  // extern "C" CudaModuleEntryFn
constexpr const char* kCudaModuleFile = "tandem-cuda.so";
constexpr const char* kCudaModuleEnv = "TANDEM_CUDA_MODULE";  // a path that overrides the lookup

// What the module's entry point returns: a static table, valid for the life of the process.
struct CudaModuleApi {
  uint32_t abi = 0;   // the module's kCudaModuleAbi
  uint32_t size = 0;  // sizeof(CudaModuleApi) in the module's build
  // backend/cuda/cuda_executor.h make_cuda_executor, backend/cuda/cuda_channels.h make_cuda_channel.
  std::unique_ptr<executor_i> (*make_executor)(ModelSpec& m, uint64_t seed,
                                               const cuda::CudaExecutorOptions& opt) = nullptr;
  std::unique_ptr<kv_channel_i> (*make_channel)(const std::string& kind, executor_i& prefill,
                                                executor_i& decode) = nullptr;
};
using CudaModuleEntryFn = const CudaModuleApi* (*)();

// Whether this build made the module (the cuda feature was on).
bool cuda_module_built();

// Where the module is looked for, in order: only $TANDEM_CUDA_MODULE when it is set (an override
// wins over the default); else tandem-cuda.so beside the running binary (/proc/self/exe), then
// the installed one (libdir/tandem/tandem-cuda.so).
std::vector<std::string> cuda_module_candidates();

// The module, loaded at the first call (thread-safe; never unloaded: its executors, CUDA
// contexts and library state live until exit). Throws InputError (exit status 2) when this
// build has none, or when no candidate exists or loads: the message names every path tried,
// with dlerror() for one that exists but would not load.
const CudaModuleApi& cuda_module();

// Whether cuda_module() has loaded the module in this process.
bool cuda_module_loaded();

// One path: dlopen (RTLD_NOW), the entry point, its ABI checked. Throws InputError saying which
// of these failed. cuda_module() tries its candidates through this.
const CudaModuleApi& open_cuda_module(const std::string& path);

}  // namespace tandem
