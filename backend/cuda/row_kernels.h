// Which version of the CUDA backend's RMSNorm and RoPE kernels runs (engine.cuda_row_kernels).
// Plain C++: both the kernels (kernels.h) and the model's options (cuda_model.h) name it.
#pragma once

namespace tandem::cuda {

// V1, the first, loops load-compute-store, so each thread waits on one global load at a time
// (15 us for one 4,096-wide row on the H200: latency, not bandwidth). V2 issues a thread's loads
// first, holding its values in registers, then does V1's arithmetic in V1's order: the same
// bits (the cuda suite compares them). V2 falls back to V1 on rows wider than its registers hold.
enum class RowKernels { V1, V2 };

}  // namespace tandem::cuda
