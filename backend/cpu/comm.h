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
// In-process ranks on the CPU: sums in rank order 0, 1, ..., N-1 for every element, so a
// run is deterministic whatever the thread timing.
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
