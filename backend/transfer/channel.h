// The KV channel of prefill/decode separation: moves a request's prompt KV from the prefill
// instance's blocks to the decode instance's. One interface for every transport:
//   sim   modelled: latency + bytes / bandwidth (optionally overlapped with the last prefill
//         step layer by layer); no bytes move. The simulated backend prices every channel so.
//   copy  one process, two KV stores: blocks read from one and written to the other.
//   tcp   two processes over a socket (sim/remote/tcp_channel.h, its worker sim/worker/worker_server.h): framed,
//         checksummed, with timeouts.
//   nccl  two GPUs in one process (send/recv).
// An RDMA transport (UCX, NIXL) would be one more implementation: the scheduler sees tickets
// and completions only.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/request.h"
#include "core/time.h"

namespace tandem {

// One transfer. Block spans are valid during start() only: a channel that works later copies
// what it needs.
struct KvTransfer {
  uint64_t ticket = 0;
  ReqId request = 0;
  int32_t num_tokens = 0;               // prompt positions whose KV moves
  std::span<const int32_t> src_blocks;  // on the prefill instance
  std::span<const int32_t> dst_blocks;  // on the decode instance (reserved, not yet written)
  Duration last_prefill_step = 0;       // the step that finished the prompt just now (layer-wise overlap); 0: none
  Time now = 0;                         // when it starts (the sim channel queues on its link)
};

// Why a transfer failed, as the engine counts it. Error: the channel or the receiver said so
// (an error, a refusal). Corrupt: what arrived or was written does not match what was sent
// (a content checksum). Partial: fewer blocks were written than sent. TimedOut: no answer
// within the channel's timeout (over tcp that ends the run: the peer is silent).
enum class TransferFault : uint8_t { None, Error, Corrupt, Partial, TimedOut };

// What start() says. Synchronous channels (sim, copy) have finished, or modelled the time to
// finish: the engine ends the ticket at now + elapsed. Asynchronous ones (tcp) end it later by
// posting the completion into the engine's inbox.
struct TransferStart {
  bool async = false;
  bool ok = true;
  Duration elapsed = 0;
  int64_t bytes = 0;  // bytes the transfer moves (or would move, modelled)
  std::string error;  // when !ok
};

class kv_channel_i {
 public:
  virtual ~kv_channel_i() = default;
  virtual std::string name() const = 0;
  virtual TransferStart start(const KvTransfer& t) = 0;
  // Stop a transfer at `now` (the engine's clock: a modelled channel frees its link from then).
  // True: it will never write into the decode blocks again, which may be freed now (a
  // synchronous abort). False: its completion (done or aborted) will still come, and until then
  // both sides keep their blocks.
  virtual bool abort(uint64_t ticket, Time now) = 0;
};

// A measured transfer time: a transfer of `bytes` took `seconds`, latency included (the median of
// an idle channel's repetitions, tandem calibrate --channel).
struct ChannelPoint {
  double bytes = 0, seconds = 0;
  bool operator==(const ChannelPoint&) const = default;
};

// The sim channel's parameters (disaggregation.channel in a workload).
struct ChannelModel {
  double bandwidth_bytes_per_s = 25e9;  // 200 Gb/s, one RDMA NIC
  double latency_s = 20e-6;
  bool layerwise = false;  // layer i's KV leaves as layer i of the last prefill step ends
  int32_t layers = 1;      // the model's, for the layer-wise overlap
  double bytes_per_token = 0;
  int32_t block_size = 16;
  // Measured times by size (bytes strictly increasing). Non-empty: a transfer's whole time is
  // read off it (piecewise linear in bytes; past the last point, at the last segment's rate) and
  // the link is held for all of it; bandwidth and latency are not used. A real channel's time is
  // rarely a line: the CPU copy runs from ~20 GB/s for a block in cache to ~4 GB/s for 100 blocks.
  std::vector<ChannelPoint> table{};
  // Whole blocks move (a partly filled last block too), as a real channel moves them.
  int64_t bytes(int32_t num_tokens) const;
  // The link's busy time for one transfer: bytes / bandwidth, or the table's time.
  Duration wire_time(int32_t num_tokens) const;
  Duration latency() const { return table.empty() ? from_seconds(latency_s) : 0; }
};

// The time a transfer of `bytes` takes by the table (see ChannelModel::table); 0 for an empty one.
double table_seconds(std::span<const ChannelPoint> table, double bytes);

}  // namespace tandem
