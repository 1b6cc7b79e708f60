// tandem calibrate --model at tp > 1: the tensor-parallel all-reduces by message size, timed on
// the communicator alone, so that a profile prices them from measurement (and shows them apart
// in steps.csv's comm_ms) instead of leaving them hidden inside the linear work.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "sim/calibrate/calibrate.h"

namespace tandem {

std::vector<ProfileStep> measure_allreduce(communicator_i& comm, int32_t hidden, int32_t layers,
                                           const std::vector<int32_t>& tokens, int reps) {
  std::vector<ProfileStep> out;
  if (comm.size() < 2 || tokens.empty()) return out;
  const int32_t max_t = *std::max_element(tokens.begin(), tokens.end());
  // One buffer per rank, as large as the largest message; values that stay finite when summed.
  std::vector<std::vector<float>> bufs(size_t(comm.size()), std::vector<float>(size_t(max_t) * size_t(hidden), 0.5f));
  std::vector<float*> ptrs;
  for (auto& b : bufs) ptrs.push_back(b.data());
  for (int32_t t : tokens) {
    const size_t n = size_t(t) * size_t(hidden);
    const auto one_step = [&] {  // two per layer, back to back, as a step runs them
      const auto t0 = std::chrono::steady_clock::now();
      for (int32_t l = 0; l < 2 * layers; ++l) comm.all_reduce_sum(ptrs, n);
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    one_step();  // warm: the buffers into cache, as inside a step
    double best = one_step();
    for (int r = 1; r < std::max(1, reps); ++r) best = std::min(best, one_step());
    out.push_back({"allreduce", 1, t, 0, false, false, best});
  }
  return out;
}

}  // namespace tandem
