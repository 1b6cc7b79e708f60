#include "sim/remote/remote_executor.h"

#include <fmt/format.h>

#include <stdexcept>

#include "backend/transfer/wire.h"

namespace tandem {

StepResult RemoteExecutor::execute(const StepPlan&) {
  throw std::logic_error("RemoteExecutor: asynchronous only");
}

void RemoteExecutor::submit(const StepPlan& plan, int64_t step_index) {
  try {
    link_.send(transfer::MsgType::Step, transfer::encode_step(uint64_t(step_index), plan));
  } catch (const std::exception& e) {
    post_(PeerLost{fmt::format("the decode worker at {}: sending step {} failed: {}", peer_, step_index, e.what())});
  }
}

}  // namespace tandem
