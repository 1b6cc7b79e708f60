// The one place an executor is built from a workload: `tandem run`, `tandem calibrate` and the
// golden tests all come here, so a new engine option reaches every backend the same way.
// sim/ includes no CUDA header: a CUDA build hands in its factory (sim/main.cpp).
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "backend/cpu/cpu_executor.h"
#include "backend/executor.h"
#include "backend/warmup.h"
#include "sim/config.h"

namespace tandem {

using ExecutorFactory = std::function<std::unique_ptr<executor_i>(Workload&)>;

// The CPU backend's options from a workload's engine section.
cpu::CpuExecutorOptions cpu_executor_options(const EngineSpec& e);

// backend: sim (the workload's cost model), cpu (the reference model) or cuda (through `cuda`,
// the factory of a CUDA build; without one, an InputError says the build has none).
std::unique_ptr<executor_i> make_executor(Workload& w, const std::string& backend,
                                          const ExecutorFactory* cuda = nullptr);

// The step shapes a real backend warms up for before it serves this workload (`tandem run`,
// calibrate): first-use costs are paid then, not by the first requests.
WarmUpShape warm_up_shape(const Workload& w);

}  // namespace tandem
