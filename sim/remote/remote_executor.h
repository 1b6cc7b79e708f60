// The decode instance's executor on this side of the tcp channel: a step goes out to the decode
// worker as a frame; its answer comes back on the link's reader (DecodeWorkerLink) as a
// StepFinished in the engine's inbox.
#pragma once
#include <functional>
#include <string>

#include "backend/executor.h"
#include "backend/transfer/tcp_link.h"
#include "sim/engine/events.h"

namespace tandem {

class RemoteExecutor final : public executor_i {
 public:
  // `post`: into the engine's inbox (thread-safe); `peer`: HOST:PORT, for messages.
  RemoteExecutor(transfer::TcpLink& link, std::string name, std::string peer, std::function<void(Event)> post)
      : link_(link), name_(std::move(name)), peer_(std::move(peer)), post_(std::move(post)) {}
  StepResult execute(const StepPlan&) override;
  // A send that fails means the worker is gone: the run ends through the inbox, as when the
  // reader sees the connection close (whichever comes first says so).
  void submit(const StepPlan& plan, int64_t step_index) override;
  bool asynchronous() const override { return true; }
  bool remote() const override { return true; }
  std::string name() const override { return name_; }
  bool simulated() const override { return false; }
  bool needs_tokens() const override { return true; }

 private:
  transfer::TcpLink& link_;
  std::string name_, peer_;
  std::function<void(Event)> post_;
};

}  // namespace tandem
