// The entry point of tandem-cuda.so, the CUDA backend as a loadable module (backend/cuda_module.h):
// compiled into the module only, beside the objects of tandem_cuda. The loader checks the table's
// version before it calls anything in it.
#include "backend/cuda/cuda_channels.h"
#include "backend/cuda/cuda_executor.h"
#include "backend/cuda_module.h"

extern "C" __attribute__((visibility("default"))) const tandem::CudaModuleApi* tandem_cuda_module() {
  static const tandem::CudaModuleApi api{.abi = tandem::kCudaModuleAbi,
                                         .size = sizeof(tandem::CudaModuleApi),
                                         .make_executor = &tandem::cuda::make_cuda_executor,
                                         .make_channel = &tandem::cuda::make_cuda_channel};
  return &api;
}
