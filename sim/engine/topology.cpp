#include "sim/engine/topology.h"

#include <fmt/format.h>

#include <stdexcept>

namespace tandem {

void topology_i::transfer_done(const TransferDone& e, Time) {
  throw std::logic_error(fmt::format("the {} topology moves no KV, yet transfer {} ended", name(), e.ticket));
}

std::string topology_i::transfer_lost(uint64_t ticket) {
  throw std::logic_error(fmt::format("the {} topology moves no KV, yet transfer {} was awaited", name(), ticket));
}

ChannelModel channel_model(const Workload& w) {
  const ChannelSpec& c = w.disaggregation.channel;
  return {.bandwidth_bytes_per_s = c.bandwidth_gbs * 1e9,
          .latency_s = c.latency_us * 1e-6,
          .layerwise = c.layerwise,
          .layers = w.model.layers,
          .bytes_per_token = w.model.kv_bytes_per_token(),
          .block_size = w.engine.block_size,
          .table = c.table};
}

}  // namespace tandem
