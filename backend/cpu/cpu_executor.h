// The CPU backend behind the executor interface: runs the reference model on each plan
// and measures the step's wall time.
#pragma once
#include <memory>
#include <span>
#include <string>

#include "backend/cpu/llama.h"
#include "backend/executor.h"
#include "backend/model_kv_store.h"
#include "policies/kv_cache.h"

namespace tandem::cpu {

class CpuExecutor final : public executor_i, public ModelKvStore<LlamaModel> {
 public:
  CpuExecutor(const ModelSpec& m, LlamaWeights w, int32_t num_blocks, int32_t block_size, int32_t tp = 1)
      : ModelKvStore(model_), model_(m, std::move(w), num_blocks, block_size, tp) {}
  StepResult execute(const StepPlan& plan) override;
  std::string name() const override { return "cpu"; }
  bool simulated() const override { return false; }
  LlamaModel& model() { return model_; }
  kv_store_i* kv_store() override { return this; }
  KvLayout kv_layout() const override { return model_.kv_layout(); }

 private:
  LlamaModel model_;
};

// As CudaExecutorOptions: each field from the engine section of a workload.
struct CpuExecutorOptions {
  int32_t kv_blocks = 0;                   // KV cache blocks (engine.resolved_kv_blocks)
  int32_t block_size = kDefaultBlockSize;  // tokens per block (engine.block_size)
  int32_t tp = 1;                          // in-process ranks the model is split over (engine.tp)
  bool deterministic = true;               // batch/chunk-invariant GEMMs (engine.deterministic)
};

// What one CPU instance allocates: its fp32 weights and its fp32 KV store (all ranks).
struct CpuMemoryNeed {
  std::string part;  // names it in a refusal ("prefill", "instance 1"); empty: a process's one instance
  std::string model;
  double weights_bytes = 0, kv_bytes = 0;
  int32_t kv_blocks = 0, block_size = 0;
};
CpuMemoryNeed cpu_memory_need(const ModelSpec& m, const CpuExecutorOptions& opt, std::string part = {});

// CPU instances that share this machine's memory fit only together: their KV stores within half
// of it, and with their weights and what this process holds already (its resident set) within
// 80% of it. Throws InputError naming each part's weights and KV. make_cpu_executor checks its
// own instance so (counting the instances built before it, which are resident by then);
// sim/run/executors.cpp checks all of a run's instances together, before it builds any.
void check_cpu_memory(std::span<const CpuMemoryNeed> parts);

// Builds the model for a workload: checkpoint weights if model.checkpoint is set, else dummy
// weights from the seed. Checks that the KV store fits in memory.
std::unique_ptr<CpuExecutor> make_cpu_executor(ModelSpec& m, uint64_t seed, const CpuExecutorOptions& opt);

}  // namespace tandem::cpu
