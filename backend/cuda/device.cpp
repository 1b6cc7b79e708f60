#include "backend/cuda/device.h"

#include <cstdio>

#include "backend/cuda/check.h"

namespace tandem::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::string device_description(int i) {
  cudaDeviceProp p{};
  TANDEM_CUDA_CHECK(cudaGetDeviceProperties(&p, i));
  char gib[32];
  std::snprintf(gib, sizeof gib, "%.1f", double(p.totalGlobalMem) / (1ull << 30));
  return std::string(p.name) + ", sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " + gib + " GiB";
}

}  // namespace tandem::cuda
