#include "backend/cuda_module.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "backend/cuda_module_config.h"  // generated: TANDEM_CUDA_MODULE_BUILT, TANDEM_CUDA_MODULE_INSTALLED
#include "core/error.h"

namespace tandem {

namespace {

std::mutex load_mu;
std::atomic<const CudaModuleApi*> loaded{nullptr};

// The running binary's folder; empty if /proc is not there.
std::string exe_dir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return {};
  return std::filesystem::path(std::string(buf, size_t(n))).parent_path().string();
}

}  // namespace

bool cuda_module_built() { return TANDEM_CUDA_MODULE_BUILT != 0; }

std::vector<std::string> cuda_module_candidates() {
  if (const char* env = std::getenv(kCudaModuleEnv); env && *env) return {env};
  std::vector<std::string> paths;
  if (const std::string dir = exe_dir(); !dir.empty()) paths.push_back(dir + "/" + kCudaModuleFile);
  if (paths.empty() || paths.front() != TANDEM_CUDA_MODULE_INSTALLED) paths.push_back(TANDEM_CUDA_MODULE_INSTALLED);
  return paths;
}

const CudaModuleApi& open_cuda_module(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw InputError(fmt::format("{}: not found", path));
  // RTLD_NOW: an undefined symbol (a module of another build of tandem) fails here, with its
  // name, and not at some later call. RTLD_LOCAL: nothing else resolves against the module. A
  // name without a slash is a file here, not a library for dlopen to search its paths for.
  const std::string file = path.find('/') == std::string::npos ? "./" + path : path;
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    throw InputError(fmt::format("{}: cannot be loaded: {}", path, why ? why : "unknown dlopen error"));
  }
  // A handle that fails below stays open: the module's static initializers (the CUDA runtime's
  // kernel registration) have run, and unloading it on the way to exit gains nothing.
  dlerror();
  const auto entry = reinterpret_cast<CudaModuleEntryFn>(dlsym(handle, kCudaModuleEntry));
  if (!entry) {
    const char* why = dlerror();
    throw InputError(
        fmt::format("{}: not a tandem CUDA module (no {}: {})", path, kCudaModuleEntry, why ? why : "null symbol"));
  }
  const CudaModuleApi* api = entry();
  if (!api || api->abi != kCudaModuleAbi || api->size != sizeof(CudaModuleApi) || !api->make_executor ||
      !api->make_channel)
    throw InputError(fmt::format(
        "{}: a stale CUDA module (its interface version {}, size {}; this tandem needs version {}, size {}): "
        "rebuild it with this binary (ninja -C BUILD_DIR)",
        path, api ? api->abi : 0, api ? api->size : 0, kCudaModuleAbi, sizeof(CudaModuleApi)));
  return *api;
}

const CudaModuleApi& cuda_module() {
  if (const CudaModuleApi* api = loaded.load(std::memory_order_acquire)) return *api;
  if (!cuda_module_built())
    throw InputError(fmt::format(
        "--backend cuda: this build has no CUDA backend (configured without the cuda feature, so no {} was built: "
        "configure with -Dcuda=enabled where nvcc, cuBLAS and NCCL are installed)",
        kCudaModuleFile));
  std::lock_guard lock(load_mu);
  if (const CudaModuleApi* api = loaded.load(std::memory_order_relaxed)) return *api;
  const std::vector<std::string> paths = cuda_module_candidates();
  std::string tried;
  bool any_there = false;
  for (const std::string& p : paths) {
    std::error_code ec;
    any_there = any_there || std::filesystem::exists(p, ec);
    try {
      const CudaModuleApi& api = open_cuda_module(p);
      loaded.store(&api, std::memory_order_release);
      return api;
    } catch (const InputError& e) {
      tried += fmt::format("\n  {}", e.what());
    }
  }
  const bool overridden = std::getenv(kCudaModuleEnv) && *std::getenv(kCudaModuleEnv);
  const std::string where =
      overridden ? fmt::format("${} is set", kCudaModuleEnv) : "beside the binary, then where it is installed";
  if (any_there)
    throw InputError(fmt::format("--backend cuda: the CUDA backend module ({}) would not load; tried ({}):{}",
                                 kCudaModuleFile, where, tried));
  throw InputError(fmt::format(
      "--backend cuda: the CUDA backend module ({}) was not found; looked at ({}):{}\n  a build with the cuda feature "
      "(meson -Dcuda=enabled, where nvcc, cuBLAS and NCCL are installed) makes it beside the tandem binary{}",
      kCudaModuleFile, where, tried, overridden ? "" : fmt::format("; ${}=PATH names another", kCudaModuleEnv)));
}

bool cuda_module_loaded() { return loaded.load(std::memory_order_acquire) != nullptr; }

}  // namespace tandem
