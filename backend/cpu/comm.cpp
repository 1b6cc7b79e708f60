#include "backend/cpu/comm.h"

#include "backend/cpu/kernels.h"

namespace tandem::cpu {

void InProcessCommunicator::all_reduce_sum(std::span<float* const> bufs, size_t n) {
  const size_t ranks = bufs.size();
#pragma omp parallel for schedule(static) num_threads(threads()) if (n > 4096)
  for (size_t i = 0; i < n; ++i) {
    float s = bufs[0][i];
    for (size_t r = 1; r < ranks; ++r) s += bufs[r][i];
    for (size_t r = 0; r < ranks; ++r) bufs[r][i] = s;
  }
}

}  // namespace tandem::cpu
