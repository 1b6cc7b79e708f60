#include "sim/engine/topology_factory.h"

#include "sim/engine/topology_colocated.h"
#include "sim/engine/topology_disaggregated.h"

namespace tandem {

std::unique_ptr<topology_i> make_topology(const Workload& w, std::span<const std::unique_ptr<Instance>> instances,
                                          std::span<Request> requests, kv_channel_i* channel, loop_i& loop) {
  if (w.disaggregation.enabled) return std::make_unique<DisaggregatedTopology>(w, instances, requests, channel, loop);
  return std::make_unique<ColocatedTopology>(instances, loop);
}

}  // namespace tandem
