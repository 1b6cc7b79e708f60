// The swappable part that runs a step: a cost model (simulated time) or a real backend.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>

#include "backend/transfer/kv_layout.h"
#include "policies/plan.h"

namespace tandem {

class cost_model_i {
 public:
  virtual ~cost_model_i() = default;
  virtual StepCost estimate(const StepPlan& plan) const = 0;
  // The inputs its costs come from (the hardware numbers or fitted coefficients), for messages.
  virtual std::string inputs() const { return {}; }
};

// A real backend's KV cache as whole blocks, for the channels of prefill/decode separation: they
// read and write block contents here, never through the scheduler. The layout is the backend's
// own, described by kv_layout(); a channel compares both sides' descriptors before it moves a
// block, and re-lays blocks out where they differ only by tensor parallelism (kv_layout.h).
class kv_store_i {
 public:
  virtual ~kv_store_i() = default;
  virtual KvLayout kv_layout() const = 0;
  // Bytes of one block: every layer's K and V for block_size positions, over all ranks.
  virtual int64_t block_bytes() const = 0;
  virtual int32_t num_blocks() const = 0;
  // out.size() == blocks.size() * block_bytes(); blocks in order.
  virtual void read_blocks(std::span<const int32_t> blocks, std::span<std::byte> out) = 0;
  virtual void write_blocks(std::span<const int32_t> blocks, std::span<const std::byte> in) = 0;
};

class executor_i {
 public:
  virtual ~executor_i() = default;
  virtual StepResult execute(const StepPlan& plan) = 0;
  virtual std::string name() const = 0;
  // True if elapsed times are modelled (virtual clock); false if measured (wall clock).
  virtual bool simulated() const = 0;
  // True if the plan must carry input token ids (StepPlan::tokens).
  virtual bool needs_tokens() const { return !simulated(); }
  // Its KV cache's blocks (real backends); null in simulated time, where no KV exists.
  virtual kv_store_i* kv_store() { return nullptr; }
  // Asynchronous executors (a decode instance in another process) take a step with submit()
  // and hand its result back later, through the engine's inbox; execute() is not called.
  virtual bool asynchronous() const { return false; }
  // In another process (a peer that may go silent: its steps get a deadline).
  virtual bool remote() const { return false; }
  virtual void submit(const StepPlan& plan, int64_t step_index) {
    (void)plan;
    (void)step_index;
    throw std::logic_error("executor: submit() on a synchronous executor");
  }
};

}  // namespace tandem
