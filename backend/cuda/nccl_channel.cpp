#include "backend/cuda/nccl_channel.h"

#include <fmt/format.h>

#include <array>
#include <stdexcept>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/device.h"
#include "backend/cuda/kv_blocks.h"
#include "core/error.h"

namespace tandem::cuda {

struct NcclChannel::Impl {
  std::vector<std::unique_ptr<KvBlockMove>> move;  // one: tp 1 on both sides
  std::array<ncclComm_t, 2> comms{};               // rank 0 on the prefill GPU, rank 1 on the decode GPU
  int64_t block_bytes = 0;
  int32_t prefill_blocks = 0, decode_blocks = 0;

  ~Impl() {
    for (ncclComm_t c : comms)
      if (c) (void)ncclCommDestroy(c);
  }

  // One chunk from the prefill GPU's staging into the decode GPU's: the send and the receive in
  // one group, as one host thread drives both ranks.
  void carry(const std::byte* from, std::byte* to, size_t bytes, cudaStream_t from_stream,
             cudaStream_t to_stream) const {
    TANDEM_NCCL_CHECK(ncclGroupStart());
    TANDEM_NCCL_CHECK(ncclSend(from, bytes, ncclUint8, 1, comms[0], from_stream));
    TANDEM_NCCL_CHECK(ncclRecv(to, bytes, ncclUint8, 0, comms[1], to_stream));
    TANDEM_NCCL_CHECK(ncclGroupEnd());
  }
};

NcclChannel::NcclChannel(CudaModel& prefill, CudaModel& decode) : impl_(std::make_unique<Impl>()) {
  if (const int gpus = device_count(); gpus < 2)
    throw std::runtime_error(fmt::format("the nccl channel needs 2 GPUs; this machine has {}", gpus));
  const std::vector<KvPoolView> p = prefill.kv_pools(), d = decode.kv_pools();
  if (p.size() != 1 || d.size() != 1)
    throw InputError(fmt::format(
        "disaggregation.channel.kind: nccl moves KV between two single-GPU instances: prefill has tp {}, decode tp "
        "{}; set engine.tp (or disaggregation.prefill.tp and decode.tp) to 1, or use the copy channel",
        p.size(), d.size()));
  if (p[0].device == d[0].device)
    throw InputError(fmt::format(
        "disaggregation.channel.kind: nccl moves KV between two GPUs, but prefill and decode are both on GPU {}: set "
        "disaggregation.decode.device (or prefill.device) so that they differ, or use the copy channel on one GPU",
        p[0].device));
  if (prefill.kv_block_bytes() != decode.kv_block_bytes())
    throw std::invalid_argument(fmt::format(
        "nccl channel: the instances' KV blocks differ in size ({} vs {} bytes): prefill and decode need the same "
        "model and block size",
        prefill.kv_block_bytes(), decode.kv_block_bytes()));
  Impl& s = *impl_;
  s.block_bytes = prefill.kv_block_bytes();
  s.prefill_blocks = prefill.kv_num_blocks();
  s.decode_blocks = decode.kv_num_blocks();
  s.move.push_back(std::make_unique<KvBlockMove>(p[0], d[0]));
  const std::array<int, 2> devices = {p[0].device, d[0].device};
  TANDEM_NCCL_CHECK(ncclCommInitAll(s.comms.data(), 2, devices.data()));
  // NCCL connects a pair of ranks on their first send: pay that here, not in the first transfer.
  const KvBlockMove& m = *s.move[0];
  s.carry(m.from_bytes(), m.to_bytes(), 16, m.from_stream(), m.to_stream());
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(m.from_stream()));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(m.to_stream()));
}

NcclChannel::~NcclChannel() = default;

TransferStart NcclChannel::start(const KvTransfer& t) {
  const Impl& s = *impl_;
  return run_kv_transfer(s.move, t, s.block_bytes, s.prefill_blocks, s.decode_blocks, "nccl",
                         [&s](const std::byte* from, std::byte* to, size_t bytes, cudaStream_t fs, cudaStream_t ts) {
                           s.carry(from, to, bytes, fs, ts);
                         });
}

}  // namespace tandem::cuda
