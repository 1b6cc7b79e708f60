#include "sim/engine/topology_colocated.h"

#include <stdexcept>

namespace tandem {

ColocatedTopology::ColocatedTopology(std::span<const std::unique_ptr<Instance>> instances, loop_i& loop)
    : loop_(loop) {
  for (const auto& in : instances) {
    if (in->role != InstanceRole::Colocated)
      throw std::logic_error("ColocatedTopology: every instance must be a colocated one");
    replicas_.push_back(in.get());
  }
  if (replicas_.empty()) throw std::logic_error("ColocatedTopology: no instance");
}

void ColocatedTopology::step_done(Instance& in, Time now) {
  for (ReqId id : in.scheduler.complete_step(now)) loop_.request_left(loop_.request(id));
}

}  // namespace tandem
