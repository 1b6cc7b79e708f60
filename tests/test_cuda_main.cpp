// The cuda suite: skipped (exit 77) where no GPU is usable; else doctest runs every
// test_cuda_*.cpp case. The device list is printed first, for logs.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "backend/cuda/device.h"

int main(int argc, char** argv) {
  const int n_dev = tandem::cuda::device_count();
  if (n_dev == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  for (int i = 0; i < n_dev; ++i) std::printf("device %d: %s\n", i, tandem::cuda::device_description(i).c_str());
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
