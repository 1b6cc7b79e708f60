// Fills a device buffer with a NaN pattern: tests poison outputs before a kernel runs so
// that an element the kernel never writes cannot pass for a correct one.
#include <cuda_runtime.h>

#include <cmath>

#include "backend/cuda/check.h"
#include "backend/cuda/poison.h"

namespace tandem::cuda {

namespace {
__global__ void fill_nan(float* x, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __int_as_float(0x7fc00000);
}
}  // namespace

void poison(float* device_buffer, size_t n) {
  if (n == 0) return;
  const unsigned threads = 256, blocks = unsigned((n + threads - 1) / threads);
  fill_nan<<<blocks, threads>>>(device_buffer, n);
  TANDEM_CUDA_CHECK(cudaGetLastError());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace tandem::cuda
