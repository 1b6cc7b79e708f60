// The KV channel of prefill/decode separation: moves a request's prompt KV from the prefill
// instance's blocks to the decode instance's. One interface for every transport:
//   sim   modelled: latency + bytes / bandwidth (optionally overlapped with the last prefill
//         step layer by layer); no bytes move. The simulated backend prices every channel so.
//   copy  one process, two KV stores: blocks read from one and written to the other.
//   tcp   two processes over a socket (sim/worker.h): framed, checksummed, with timeouts.
//   nccl  two GPUs in one process (send/recv).
// An RDMA transport (UCX, NIXL) would be one more implementation: the scheduler sees tickets
// and completions only.
#pragma once
#include <cstdint>
#include <span>
#include <string>

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

// The sim channel's parameters (disaggregation.channel in a workload).
struct ChannelModel {
  double bandwidth_bytes_per_s = 25e9;  // 200 Gb/s, one RDMA NIC
  double latency_s = 20e-6;
  bool layerwise = false;  // layer i's KV leaves as layer i of the last prefill step ends
  int32_t layers = 1;      // the model's, for the layer-wise overlap
  double bytes_per_token = 0;
  int32_t block_size = 16;
  // Whole blocks move (a partly filled last block too), as a real channel moves them.
  int64_t bytes(int32_t num_tokens) const;
  // The link's busy time for one transfer: bytes / bandwidth.
  Duration wire_time(int32_t num_tokens) const;
  Duration latency() const { return from_seconds(latency_s); }
};

}  // namespace tandem
