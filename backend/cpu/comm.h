// Tensor-parallel collectives. Ranks are driven from one process (threads on the CPU, one
// thread per GPU with NCCL), so a collective is one call over every rank's buffer.
#pragma once
#include <cstddef>
#include <span>

namespace tandem {

class communicator_i {
 public:
  virtual ~communicator_i() = default;
  virtual int size() const = 0;
  // Every rank's buffer (n floats) becomes the elementwise sum over ranks.
  virtual void all_reduce_sum(std::span<float* const> rank_buffers, size_t n) = 0;
};

namespace cpu {
// In-process ranks on the CPU: every element is the pairwise tree_sum of the ranks' values in
// rank order ((r0 + r1) + (r2 + r3)), so a run is deterministic whatever the thread timing, and
// the upper levels of the segmented row-split GEMM's tree (kernels.h gemm_nt_segmented): the
// reduction of TP 1 done by TP ranks.
class InProcessCommunicator final : public communicator_i {
 public:
  explicit InProcessCommunicator(int n) : n_(n) {}
  int size() const override { return n_; }
  void all_reduce_sum(std::span<float* const> rank_buffers, size_t n) override;

 private:
  int n_;
};
}  // namespace cpu

}  // namespace tandem
