// The CUDA backend's module loader (backend/cuda_module.h) and the factories sim/ reaches it by
// (sim/run/executors.h), without a GPU or the real module: stand-in modules (cuda_module_fake.cpp)
// that lack the entry point, carry another interface version, or throw from their factories.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cost_model.h"
#include "backend/cuda_module.h"
#include "core/error.h"
#include "sim/workload/config.h"
#include "sim/run/executors.h"

using namespace tandem;

namespace {

const std::string kFakeDir = TANDEM_TEST_MODULE_DIR;
const std::string kThrowing = kFakeDir + "/fake-cuda-throwing.so";
const std::string kStale = kFakeDir + "/fake-cuda-stale.so";
const std::string kNoEntry = kFakeDir + "/fake-cuda-no-entry.so";

// The InputError's message (fails the test if something else, or nothing, was thrown).
template <class F>
std::string input_error_of(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("no InputError");
  return {};
}

struct EnvOverride {
  explicit EnvOverride(const std::string& path) { setenv(kCudaModuleEnv, path.c_str(), 1); }
  ~EnvOverride() { unsetenv(kCudaModuleEnv); }
};

}  // namespace

TEST_CASE("the module is looked for beside the binary, then where it is installed; the env var overrides both") {
  unsetenv(kCudaModuleEnv);
  const std::vector<std::string> paths = cuda_module_candidates();
  REQUIRE(paths.size() == 2);
  CHECK(paths[0] == kFakeDir + "/tandem-cuda.so");  // this test binary's folder (tests/)
  CHECK(paths[1].ends_with("/tandem/tandem-cuda.so"));
  {
    EnvOverride env("/somewhere/else.so");
    CHECK(cuda_module_candidates() == std::vector<std::string>{"/somewhere/else.so"});
  }
  EnvOverride empty("");  // set but empty: as if unset
  CHECK(cuda_module_candidates() == paths);
}

TEST_CASE("a module that is missing, not a shared object, foreign or stale is refused, saying which") {
  CHECK(input_error_of([] { open_cuda_module("/nonexistent/tandem-cuda.so"); }) ==
        "/nonexistent/tandem-cuda.so: not found");
  const std::string not_elf = std::string(TANDEM_SOURCE_DIR) + "/README.md";
  const std::string bad = input_error_of([&] { open_cuda_module(not_elf); });
  CHECK(bad.starts_with(not_elf + ": cannot be loaded: "));
  CHECK(bad.find("README.md") != std::string::npos);  // dlerror() names the file
  CHECK(input_error_of([] { open_cuda_module(kNoEntry); }).find("not a tandem CUDA module (no tandem_cuda_module") !=
        std::string::npos);
  const std::string stale = input_error_of([] { open_cuda_module(kStale); });
  CHECK(stale.find("a stale CUDA module (its interface version 0") != std::string::npos);
  CHECK(stale.find(fmt::format("this tandem needs version {}", kCudaModuleAbi)) != std::string::npos);
}

TEST_CASE("exceptions thrown in a module reach the caller as their own types") {
  const CudaModuleApi& api = open_cuda_module(kThrowing);
  CHECK(api.abi == kCudaModuleAbi);
  ModelSpec m;
  cuda::CudaExecutorOptions o;
  o.kv_blocks = 7;
  CHECK(input_error_of([&] { api.make_executor(m, 1, o); }) == "fake CUDA module: refused this model (kv_blocks 7)");
  SimExecutor a(nullptr), b(nullptr);
  CHECK_THROWS_WITH_AS(api.make_channel("nccl", a, b), "fake CUDA module: no nccl channel", std::runtime_error);
}

// Last in this file: the first successful load stays for the life of the process.
TEST_CASE("cuda_module() loads once, on the first executor; the channel factory never loads it") {
  REQUIRE_FALSE(cuda_module_loaded());
  Workload w;
  w.engine.resolved_kv_blocks = 9;
  if (!cuda_module_built()) {  // -Dcuda=disabled: the factories are null and the loader says so
    CHECK(cuda_executor_factory() == nullptr);
    CHECK(cuda_channel_factory() == nullptr);
    EnvOverride env(kThrowing);  // not consulted: this binary exports nothing for a module to bind to
    CHECK(input_error_of([] { cuda_module(); }).starts_with("--backend cuda: this build has no CUDA backend"));
    CHECK_FALSE(cuda_module_loaded());
    return;
  }
  REQUIRE(cuda_executor_factory() != nullptr);
  REQUIRE(cuda_channel_factory() != nullptr);
  {
    EnvOverride env("/nonexistent/tandem-cuda.so");
    const std::string e = input_error_of([&] { (*cuda_executor_factory())(w); });
    CHECK(e.starts_with("--backend cuda: the CUDA backend module (tandem-cuda.so) was not found; looked at"));
    CHECK(e.find("$TANDEM_CUDA_MODULE is set):\n  /nonexistent/tandem-cuda.so: not found") != std::string::npos);
    SimExecutor a(nullptr), b(nullptr);
    CHECK((*cuda_channel_factory())("copy", a, b) == nullptr);  // a CPU or simulated run: no load attempted
    CHECK_FALSE(cuda_module_loaded());
  }
  {
    EnvOverride env(kStale);  // there, but refused: said so, with the reason
    const std::string e = input_error_of([&] { (*cuda_executor_factory())(w); });
    CHECK(e.starts_with("--backend cuda: the CUDA backend module (tandem-cuda.so) would not load; tried"));
    CHECK(e.find(kStale + ": a stale CUDA module") != std::string::npos);
    CHECK_FALSE(cuda_module_loaded());
  }
  EnvOverride env(kThrowing);
  // The factory passes the engine section on (kv_blocks), and the module's InputError comes through.
  CHECK(input_error_of([&] { (*cuda_executor_factory())(w); }) == "fake CUDA module: refused this model (kv_blocks 9)");
  CHECK(cuda_module_loaded());
  CHECK(&cuda_module() == &open_cuda_module(kThrowing));  // loaded once: the same table
  SimExecutor a(nullptr), b(nullptr);
  CHECK_THROWS_WITH_AS((*cuda_channel_factory())("copy", a, b), "fake CUDA module: no copy channel",
                       std::runtime_error);
}
