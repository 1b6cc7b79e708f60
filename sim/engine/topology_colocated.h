// Colocated serving: N replicas (engine.data_parallel; one is stage 1-3's single instance),
// each with its own scheduler, KV cache and executor; request i goes to replica i mod N.
#pragma once
#include <span>
#include <vector>

#include "sim/engine/topology.h"

namespace tandem {

class ColocatedTopology final : public topology_i {
 public:
  ColocatedTopology(std::span<const std::unique_ptr<Instance>> instances, loop_i& loop);
  std::string name() const override { return "colocated"; }
  FailReason arrival_failure(const Request& r) const override { return replica(r.id).scheduler.arrival_failure(r); }
  Instance& entry(ReqId id) override { return replica(id); }
  bool add_request(ReqId id, Time now, std::vector<BlockHash> prompt_hashes) override {
    return replica(id).scheduler.add_request(id, now, std::move(prompt_hashes));
  }
  bool cancel(ReqId id, Time now) override { return replica(id).scheduler.cancel(id, now); }
  void step_done(Instance& in, Time now) override;

 private:
  Instance& replica(ReqId id) const { return *replicas_[size_t(id) % replicas_.size()]; }
  std::vector<Instance*> replicas_;
  loop_i& loop_;
};

}  // namespace tandem
