// Tensor-parallel collectives over NCCL: one process, one rank per GPU (ncclCommInitAll),
// driven from one host thread with grouped calls. Implements the same interface as the
// CPU's in-process communicator; buffers are device pointers, rank i's on device i.
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <span>
#include <vector>

#include "backend/cpu/comm.h"

namespace tandem::cuda {

class NcclCommunicator final : public communicator_i {
 public:
  explicit NcclCommunicator(int n_devices, int first_device = 0);  // devices first..first+n-1
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  int size() const override;
  // In place on every rank's device buffer; returns when every rank's result is ready.
  void all_reduce_sum(std::span<float* const> rank_buffers, size_t n) override;
  // The same, enqueued on each rank's stream (ordered after the work already there); no wait.
  void all_reduce_sum_async(std::span<float* const> rank_buffers, size_t n, std::span<const cudaStream_t> streams);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::cuda
