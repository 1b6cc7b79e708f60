// The cuda suite: skipped (exit 77) where no GPU is usable. With one: the toolchain's own
// kernel runs (poison), and NCCL all-reduce at TP 1 leaves data bit-identical; with two or
// more GPUs, the sum over ranks equals the CPU's in-process communicator.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "backend/cpu/comm.h"
#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/nccl_communicator.h"
#include "backend/cuda/poison.h"
#include "sim/rng.h"

using namespace tandem;

namespace {
int failures = 0, checks = 0;
void check(bool ok, const char* what) {
  ++checks;
  if (!ok) {
    ++failures;
    std::printf("FAIL: %s\n", what);
  }
}
std::vector<float> random_floats(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(r.uniform(-1, 1));
  return v;
}
}  // namespace

int main() {
  const int n_dev = cuda::device_count();
  if (n_dev == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  for (int i = 0; i < n_dev; ++i) std::printf("device %d: %s\n", i, cuda::device_description(i).c_str());
  const size_t n = (1u << 20) + 3;
  // Poison: every element written.
  float* d = nullptr;
  TANDEM_CUDA_CHECK(cudaSetDevice(0));
  TANDEM_CUDA_CHECK(cudaMalloc(&d, n * sizeof(float)));
  cuda::poison(d, n);
  std::vector<float> h(n, 0.0f);
  TANDEM_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  size_t nan = 0;
  for (float x : h) nan += x != x;
  check(nan == n, "poison writes NaN to every element");
  // NCCL at TP 1: an all-reduce over one rank is the identity, bit for bit.
  {
    const auto src = random_floats(n, 1);
    TANDEM_CUDA_CHECK(cudaMemcpy(d, src.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    cuda::NcclCommunicator comm(1);
    float* bufs[] = {d};
    comm.all_reduce_sum(bufs, n);
    TANDEM_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    check(std::memcmp(h.data(), src.data(), n * sizeof(float)) == 0, "NCCL all-reduce at TP 1 is bit-identical");
  }
  TANDEM_CUDA_CHECK(cudaFree(d));
  // Several GPUs: NCCL's sum against the CPU communicator's (two ranks: a + b either way).
  if (n_dev >= 2) {
    std::vector<std::vector<float>> host = {random_floats(n, 2), random_floats(n, 3)};
    std::vector<float*> dev(2);
    for (int r = 0; r < 2; ++r) {
      TANDEM_CUDA_CHECK(cudaSetDevice(r));
      TANDEM_CUDA_CHECK(cudaMalloc(&dev[size_t(r)], n * sizeof(float)));
      TANDEM_CUDA_CHECK(cudaMemcpy(dev[size_t(r)], host[size_t(r)].data(), n * sizeof(float), cudaMemcpyHostToDevice));
    }
    cuda::NcclCommunicator comm(2);
    comm.all_reduce_sum(dev, n);
    float* hb[] = {host[0].data(), host[1].data()};
    cpu::InProcessCommunicator(2).all_reduce_sum(hb, n);
    for (int r = 0; r < 2; ++r) {
      TANDEM_CUDA_CHECK(cudaSetDevice(r));
      TANDEM_CUDA_CHECK(cudaMemcpy(h.data(), dev[size_t(r)], n * sizeof(float), cudaMemcpyDeviceToHost));
      check(std::memcmp(h.data(), host[0].data(), n * sizeof(float)) == 0, "NCCL TP 2 sum == CPU communicator sum");
      TANDEM_CUDA_CHECK(cudaFree(dev[size_t(r)]));
    }
  } else {
    std::printf("TP > 1 on GPUs not run: %d GPU(s) here, NCCL needs one GPU per rank\n", n_dev);
  }
  std::printf("%d passed, %d failed\n", checks - failures, failures);
  return failures == 0 ? 0 : 1;
}
