// The nccl channel (stage 4): the prefill instance on one GPU, the decode instance on another, in
// one process, tensor parallelism 1 each. A 2-rank NCCL communicator (ncclCommInitAll, rank 0 the
// prefill GPU); a transfer packs the prompt's blocks on the prefill GPU, moves them with one
// grouped send/recv per chunk, and unpacks them into the decode blocks (kv_blocks.h).
// Synchronous: start() returns when the blocks are written, with the measured time, so an abort
// always finds it finished. Plain C++: no CUDA or NCCL header comes with it.
#pragma once
#include <memory>
#include <string>

#include "backend/transfer/channel.h"

namespace tandem::cuda {

class CudaModel;

class NcclChannel final : public kv_channel_i {
 public:
  // Throws std::runtime_error where fewer than 2 GPUs exist, InputError for a model split over
  // more than one GPU or both instances on one GPU, std::invalid_argument if their blocks differ.
  NcclChannel(CudaModel& prefill, CudaModel& decode);
  ~NcclChannel() override;
  std::string name() const override { return "nccl"; }
  TransferStart start(const KvTransfer& t) override;
  bool abort(uint64_t, Time) override { return true; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::cuda
