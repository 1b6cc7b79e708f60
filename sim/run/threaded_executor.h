// A local executor on a thread of its own, so that several instances of one wall-clock run
// compute at the same time: the prefill instance's steps beside a decode worker's (tcp), or two
// in-process instances. The loop submits a step and goes on; the result comes back as a
// StepFinished in the inbox. Runs in virtual time stay synchronous (and reproducible).
#pragma once
#include <condition_variable>
#include <mutex>
#include <thread>

#include "backend/executor.h"
#include "sim/engine/inbox.h"

namespace tandem {

class ThreadedExecutor final : public executor_i {
 public:
  ThreadedExecutor(executor_i& inner, int32_t instance) : inner_(inner), instance_(instance) {}
  ~ThreadedExecutor() override;
  // From here results are posted into `inbox`; the thread starts. Stop (join) before the inbox goes.
  void attach(Inbox& inbox);
  void stop();

  StepResult execute(const StepPlan& plan) override { return inner_.execute(plan); }
  void submit(const StepPlan& plan, int64_t step_index) override;
  bool asynchronous() const override { return true; }
  std::string name() const override { return inner_.name(); }
  bool simulated() const override { return inner_.simulated(); }
  bool needs_tokens() const override { return inner_.needs_tokens(); }
  kv_store_i* kv_store() override { return inner_.kv_store(); }

 private:
  void loop();

  executor_i& inner_;
  const int32_t instance_;
  Inbox* inbox_ = nullptr;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  const StepPlan* pending_ = nullptr;  // under mu_; the scheduler keeps it unchanged until the step completes
  bool stopping_ = false;              // under mu_
};

}  // namespace tandem
