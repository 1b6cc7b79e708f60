// The one place an executor is built from a workload: `tandem run`, `tandem calibrate` and the
// golden tests all come here, so a new engine option reaches every backend the same way.
// sim/ includes no CUDA header: the CUDA backend comes in as a factory (sim/commands/main.cpp hands in
// cuda_executor_factory(), which reaches the loadable module, backend/cuda_module.h).
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "backend/cpu/cpu_executor.h"
#include "backend/cuda_module.h"
#include "backend/executor.h"
#include "backend/transfer/channel.h"
#include "backend/warmup.h"
#include "sim/workload/config.h"
#include "sim/remote/worker_link.h"

namespace tandem {

using ExecutorFactory = std::function<std::unique_ptr<executor_i>(Workload&)>;

// The CPU backend's options from a workload's engine section.
cpu::CpuExecutorOptions cpu_executor_options(const EngineSpec& e);

// The CUDA backend's options from a workload's engine section.
cuda::CudaExecutorOptions cuda_executor_options(const EngineSpec& e);

// backend: sim (the workload's cost model), cpu (the reference model) or cuda (through `cuda`,
// the factory of a CUDA build; without one, an InputError says the build has none).
std::unique_ptr<executor_i> make_executor(Workload& w, const std::string& backend,
                                          const ExecutorFactory* cuda = nullptr);

// The executors of a run's instances (`specs`, instance_specs(w): one, data_parallel replicas, or
// prefill + decode), each built from its instance's engine section, and the KV channel between
// prefill and decode (null: none, or the simulated backend, where the engine prices the sim
// channel). A run is set up through RunSetup (sim/run/run_setup.h), which calls this.
// The tcp channel's decode instance lives in a worker process (`remote`); attach it to the
// engine's inbox once the engine exists, and detach it before the engine goes.
struct RunExecutors {
  std::vector<std::unique_ptr<executor_i>> owned;
  std::vector<executor_i*> executors;  // by instance
  std::unique_ptr<kv_channel_i> owned_channel;
  std::unique_ptr<DecodeWorkerLink> remote;
  kv_channel_i* channel = nullptr;
  bool simulated() const { return executors.front()->simulated(); }
};
// A CUDA build's channels between two of its executors in one process (copy device to device,
// nccl), by channel kind; null when it has none of that kind for these executors.
using ChannelFactory =
    std::function<std::unique_ptr<kv_channel_i>(const std::string& kind, executor_i& prefill, executor_i& decode)>;
// `threads`: the CPU backend's threads, passed on to a decode worker this starts. `channels`: a
// CUDA build's channel factory, asked first; without one (or when it has none), copy moves
// blocks through host memory (CopyChannel).
RunExecutors make_run_executors(Workload& w, std::span<const InstanceSpec> specs, const std::string& backend,
                                const ExecutorFactory* cuda = nullptr, int threads = 0,
                                const ChannelFactory* channels = nullptr);

// The CUDA backend's factories, bound to its loadable module (backend/cuda_module.h); null in a
// build without the module, where make_executor and the commands say the build has none. The
// executor factory loads the module at its first call (an InputError, exit 2, if it cannot): a
// command that builds no CUDA executor never maps cuBLAS, NCCL or the CUDA runtime. The channel
// factory never loads it: without the module there is no CUDA executor to connect, and it
// answers null as the module's own does for other executors.
const ExecutorFactory* cuda_executor_factory();
const ChannelFactory* cuda_channel_factory();

// The step shapes a real backend warms up for before it serves this workload (`tandem run`,
// calibrate): first-use costs are paid then, not by the first requests.
WarmUpShape warm_up_shape(const Workload& w);

}  // namespace tandem
