// The KV channels between two CUDA executors in one process (stage 4), device to device: the
// blocks never cross host memory. sim/ reaches them through the channel factory of the loadable
// module (backend/cuda_module.h), as it reaches the executor.
//   copy  each rank's blocks from the prefill pool to the decode pool of the same rank: on one
//         GPU a pack and an unpack kernel, between GPUs a peer copy between them (device-copy)
//   nccl  two GPUs, NCCL send/recv (nccl_channel.h)
// Plain C++: no CUDA header comes with it.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/executor.h"
#include "backend/transfer/channel.h"

namespace tandem::cuda {

class CudaModel;
class KvBlockMove;

// Synchronous (an abort always finds it finished); start() reports the measured time.
class DeviceCopyChannel final : public kv_channel_i {
 public:
  // Throws std::invalid_argument if the models' KV blocks differ (model, block size, tp).
  DeviceCopyChannel(CudaModel& from, CudaModel& to);
  ~DeviceCopyChannel() override;
  std::string name() const override { return "device-copy"; }
  TransferStart start(const KvTransfer& t) override;
  bool abort(uint64_t, Time) override { return true; }

 private:
  std::vector<std::unique_ptr<KvBlockMove>> ranks_;
  int64_t block_bytes_ = 0;
  int32_t from_blocks_ = 0, to_blocks_ = 0;
};

// The channel factory (sim/run/executors.h ChannelFactory): the kind's row in the channel table
// (backend/transfer/channel_kind.h, its `device`) picks DeviceCopyChannel or NcclChannel when both
// executors are CUDA ones; null otherwise (sim/ then takes the generic
// channel of that kind, or reports that there is none), and for copy between layouts that differ
// by tensor parallelism (the generic copy channel re-lays them out). Layouts that cannot be
// converted: InputError naming both sides.
std::unique_ptr<kv_channel_i> make_cuda_channel(const std::string& kind, executor_i& prefill, executor_i& decode);

}  // namespace tandem::cuda
