// The CUDA backend behind the executor interface. Plain C++: sim/main.cpp includes this
// header only in builds with the CUDA feature on, and no CUDA header comes with it.
#pragma once
#include <memory>

#include "backend/executor.h"
#include "sim/config.h"

namespace tandem::cuda {

// Builds the backend for a workload: GPU 0 (or GPUs 0..engine.tp-1), checkpoint weights if
// model.checkpoint is set, else dummy bf16 weights generated on the device from the seed.
// engine.deterministic pins the GEMM algorithms; engine.cuda_graph replays decode steps from
// captured graphs. Throws InputError for a configuration that cannot run (memory, shapes) and
// std::runtime_error when no usable GPU is present.
std::unique_ptr<executor_i> make_cuda_executor(ModelSpec& m, uint64_t seed, const EngineSpec& engine);

}  // namespace tandem::cuda
