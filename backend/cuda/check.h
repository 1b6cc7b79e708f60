// Every CUDA, cuBLAS and NCCL call is checked; a failure names the call and where it was made.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

namespace tandem::cuda {

[[noreturn]] inline void fail(const char* call, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string(call) + " failed: " + what + " (" + file + ":" + std::to_string(line) + ")");
}

}  // namespace tandem::cuda

#define TANDEM_CUDA_CHECK(call)                                                                                       \
  do {                                                                                                                \
    const cudaError_t tandem_err_ = (call);                                                                           \
    if (tandem_err_ != cudaSuccess) ::tandem::cuda::fail(#call, cudaGetErrorString(tandem_err_), __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: a bad configuration shows up here, not at the next synchronisation.
#define TANDEM_LAUNCH_CHECK(kernel_name)                                                                   \
  do {                                                                                                     \
    const cudaError_t tandem_err_ = cudaGetLastError();                                                    \
    if (tandem_err_ != cudaSuccess)                                                                        \
      ::tandem::cuda::fail("launch of " kernel_name, cudaGetErrorString(tandem_err_), __FILE__, __LINE__); \
  } while (0)

#define TANDEM_CUBLAS_CHECK(call)                                                          \
  do {                                                                                     \
    const cublasStatus_t tandem_err_ = (call);                                             \
    if (tandem_err_ != CUBLAS_STATUS_SUCCESS)                                              \
      ::tandem::cuda::fail(#call, cublasGetStatusString(tandem_err_), __FILE__, __LINE__); \
  } while (0)

#define TANDEM_NCCL_CHECK(call)                                                                                       \
  do {                                                                                                                \
    const ncclResult_t tandem_err_ = (call);                                                                          \
    if (tandem_err_ != ncclSuccess) ::tandem::cuda::fail(#call, ncclGetErrorString(tandem_err_), __FILE__, __LINE__); \
  } while (0)
