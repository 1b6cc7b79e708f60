#include "backend/cpu/comm.h"

#include <vector>

#include "backend/cpu/kernels.h"

namespace tandem::cpu {

void InProcessCommunicator::all_reduce_sum(std::span<float* const> bufs, size_t n) {
  const size_t ranks = bufs.size();
#pragma omp parallel num_threads(threads()) if (n > 4096)
  {
    std::vector<float> v(ranks);
#pragma omp for schedule(static)
    for (size_t i = 0; i < n; ++i) {
      for (size_t r = 0; r < ranks; ++r) v[r] = bufs[r][i];
      const float s = tree_sum(v.data(), int64_t(ranks));
      for (size_t r = 0; r < ranks; ++r) bufs[r][i] = s;
    }
  }
}

}  // namespace tandem::cpu
