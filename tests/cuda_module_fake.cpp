// Stand-ins for tandem-cuda.so (backend/cuda_module.h), built as modules for the loader's tests
// (test_cuda_module.cpp, cuda_module_cli.sh), one variant per define:
//   FAKE_NO_ENTRY  no entry point (some other shared object)
//   FAKE_ABI=N     an entry point whose table says interface version N (a stale module)
//   neither        the current version; its factories throw, as the real backend does on bad
//                  input (InputError) or without a GPU (std::runtime_error), to show that an
//                  exception thrown in a module reaches the caller's handlers.
#include <stdexcept>

#include "backend/cuda_module.h"
#include "core/error.h"

#ifndef FAKE_NO_ENTRY
namespace {
std::unique_ptr<tandem::executor_i> make_executor(tandem::ModelSpec&, uint64_t,
                                                  const tandem::cuda::CudaExecutorOptions& o) {
  throw tandem::InputError("fake CUDA module: refused this model (kv_blocks " + std::to_string(o.kv_blocks) + ")");
}
std::unique_ptr<tandem::kv_channel_i> make_channel(const std::string& kind, tandem::executor_i&, tandem::executor_i&) {
  throw std::runtime_error("fake CUDA module: no " + kind + " channel");
}
}  // namespace

extern "C" __attribute__((visibility("default"))) const tandem::CudaModuleApi* tandem_cuda_module() {
#ifdef FAKE_ABI
  static const tandem::CudaModuleApi api{.abi = FAKE_ABI,
                                         .size = sizeof(tandem::CudaModuleApi),
                                         .make_executor = &make_executor,
                                         .make_channel = &make_channel};
#else
  static const tandem::CudaModuleApi api{.abi = tandem::kCudaModuleAbi,
                                         .size = sizeof(tandem::CudaModuleApi),
                                         .make_executor = &make_executor,
                                         .make_channel = &make_channel};
#endif
  return &api;
}
#else
extern "C" __attribute__((visibility("default"))) int tandem_fake_module_without_entry() { return 0; }
#endif
