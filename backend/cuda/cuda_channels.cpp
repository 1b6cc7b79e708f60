#include "backend/cuda/cuda_channels.h"

#include <fmt/format.h>

#include <stdexcept>

#include "backend/cuda/cuda_executor.h"
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/kv_blocks.h"
#include "backend/cuda/nccl_channel.h"
#include "backend/transfer/channel_kind.h"
#include "core/error.h"

namespace tandem::cuda {

DeviceCopyChannel::DeviceCopyChannel(CudaModel& from, CudaModel& to)
    : block_bytes_(from.kv_block_bytes()), from_blocks_(from.kv_num_blocks()), to_blocks_(to.kv_num_blocks()) {
  const std::vector<KvPoolView> a = from.kv_pools(), b = to.kv_pools();
  if (a.size() != b.size() || from.kv_block_bytes() != to.kv_block_bytes())
    throw std::invalid_argument(fmt::format(
        "device copy channel: the instances' KV blocks differ ({} ranks of {} bytes vs {} of {}): prefill and decode "
        "need the same model, block size and tensor parallelism",
        a.size(), from.kv_block_bytes(), b.size(), to.kv_block_bytes()));
  for (size_t r = 0; r < a.size(); ++r) ranks_.push_back(std::make_unique<KvBlockMove>(a[r], b[r]));
}

DeviceCopyChannel::~DeviceCopyChannel() = default;

TransferStart DeviceCopyChannel::start(const KvTransfer& t) {
  return run_kv_transfer(ranks_, t, block_bytes_, from_blocks_, to_blocks_, "device copy");
}

std::unique_ptr<kv_channel_i> make_cuda_channel(const std::string& kind, executor_i& prefill, executor_i& decode) {
  CudaModel* from = cuda_model_of(prefill);
  CudaModel* to = cuda_model_of(decode);
  if (!from || !to) return nullptr;
  // The layouts first (kv_layout.h): refused naming both sides, or, where only tensor parallelism
  // differs, the generic copy channel re-lays the blocks out through host memory (no device-side
  // re-layout is built; the nccl channel refuses TP above 1 on either side below).
  const KvLayoutCheck c = check_kv_layouts(prefill.kv_store()->kv_layout(), decode.kv_store()->kv_layout());
  if (c.match == KvLayoutMatch::Incompatible) throw InputError(fmt::format("{} channel: {}", kind, c.why));
  // Which implementation: the table's row says (channel_kind.h), so no kind is named here.
  const ChannelKind* row = find_channel_kind(kind);
  switch (row ? row->device : DeviceChannel::none) {
    case DeviceChannel::copy:
      if (c.match == KvLayoutMatch::Relayout) return nullptr;
      return std::make_unique<DeviceCopyChannel>(*from, *to);
    case DeviceChannel::nccl:
      return std::make_unique<NcclChannel>(*from, *to);
    case DeviceChannel::none:
      break;
  }
  return nullptr;
}

}  // namespace tandem::cuda
