#include "backend/cuda/nccl_communicator.h"

#include "backend/cuda/check.h"

namespace tandem::cuda {

struct NcclCommunicator::Impl {
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
  int first_device = 0;  // rank r runs on GPU first_device + r
};

NcclCommunicator::NcclCommunicator(int n, int first) : impl_(std::make_unique<Impl>()) {
  if (n < 1) throw std::invalid_argument("NcclCommunicator: needs at least one device");
  impl_->comms.resize(size_t(n));
  impl_->streams.resize(size_t(n));
  std::vector<int> devs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) devs[size_t(i)] = first + i;
  impl_->first_device = first;
  TANDEM_NCCL_CHECK(ncclCommInitAll(impl_->comms.data(), n, devs.data()));
  for (int i = 0; i < n; ++i) {
    TANDEM_CUDA_CHECK(cudaSetDevice(first + i));
    TANDEM_CUDA_CHECK(cudaStreamCreate(&impl_->streams[size_t(i)]));
  }
}

NcclCommunicator::~NcclCommunicator() {
  for (size_t i = 0; i < impl_->comms.size(); ++i) {
    (void)cudaSetDevice(impl_->first_device + int(i));
    (void)cudaStreamDestroy(impl_->streams[i]);
    (void)ncclCommDestroy(impl_->comms[i]);
  }
}

int NcclCommunicator::size() const { return int(impl_->comms.size()); }

void NcclCommunicator::all_reduce_sum_async(std::span<float* const> bufs, size_t n,
                                            std::span<const cudaStream_t> streams) {
  if (bufs.size() != impl_->comms.size() || streams.size() != bufs.size())
    throw std::invalid_argument("NcclCommunicator: one buffer and one stream per rank");
  TANDEM_NCCL_CHECK(ncclGroupStart());
  for (size_t r = 0; r < bufs.size(); ++r)
    TANDEM_NCCL_CHECK(ncclAllReduce(bufs[r], bufs[r], n, ncclFloat32, ncclSum, impl_->comms[r], streams[r]));
  TANDEM_NCCL_CHECK(ncclGroupEnd());
}

void NcclCommunicator::all_reduce_sum(std::span<float* const> bufs, size_t n) {
  all_reduce_sum_async(bufs, n, impl_->streams);
  for (size_t r = 0; r < bufs.size(); ++r) {
    TANDEM_CUDA_CHECK(cudaSetDevice(impl_->first_device + int(r)));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(impl_->streams[r]));
  }
}

}  // namespace tandem::cuda
