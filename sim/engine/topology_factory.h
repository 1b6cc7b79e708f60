// The run's topology, chosen from its workload: the one place that names both implementations,
// so that topology.h (the interface) and each implementation include only downward.
#pragma once
#include <memory>
#include <span>

#include "sim/engine/topology.h"

namespace tandem {

// The run's topology over `instances` (by id, as instance_specs(w) made them): colocated
// replicas, or prefill + decode with `channel` between them (null: the sim channel priced from
// the workload, for the simulated backend only).
std::unique_ptr<topology_i> make_topology(const Workload& w, std::span<const std::unique_ptr<Instance>> instances,
                                          std::span<Request> requests, kv_channel_i* channel, loop_i& loop);

}  // namespace tandem
