#include "sim/run/threaded_executor.h"

#include <fmt/format.h>

namespace tandem {

ThreadedExecutor::~ThreadedExecutor() { stop(); }

void ThreadedExecutor::attach(Inbox& inbox) {
  inbox_ = &inbox;
  thread_ = std::thread([this] { loop(); });
}

void ThreadedExecutor::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void ThreadedExecutor::submit(const StepPlan& plan, int64_t) {
  {
    std::lock_guard lock(mu_);
    if (pending_) throw std::logic_error("ThreadedExecutor: a step is already in flight");
    pending_ = &plan;
  }
  cv_.notify_one();
}

void ThreadedExecutor::loop() {
  for (;;) {
    const StepPlan* plan = nullptr;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || pending_; });
      if (stopping_) return;
      plan = pending_;
    }
    Event done;
    try {
      done = StepFinished{instance_, inner_.execute(*plan)};
    } catch (const std::exception& e) {
      done = PeerLost{fmt::format("instance {} failed a step in the {} backend: {}", instance_, inner_.name(), e.what()),
                      FailReason::BackendError};
    }
    {
      std::lock_guard lock(mu_);
      pending_ = nullptr;  // before the post: the loop may submit the next step at once
    }
    inbox_->post(std::move(done));
  }
}

}  // namespace tandem
