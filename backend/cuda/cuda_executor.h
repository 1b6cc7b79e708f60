// The CUDA backend behind the executor interface. Plain C++: no CUDA header comes with it. The
// executable reaches it through the loadable module (backend/cuda/module.cpp,
// backend/cuda_module.h, where CudaExecutorOptions is defined as part of the module's interface).
#pragma once
#include <cstdint>
#include <memory>

#include "backend/cuda_module.h"
#include "backend/executor.h"
#include "backend/specs.h"

namespace tandem::cuda {

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
