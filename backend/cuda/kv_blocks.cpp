#include "backend/cuda/kv_blocks.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "backend/cuda/check.h"

namespace tandem::cuda {

void check_block_ids(std::span<const int32_t> blocks, int32_t num_blocks, const char* who) {
  for (const int32_t b : blocks)
    if (b < 0 || b >= num_blocks)
      throw std::invalid_argument(fmt::format("{}: block {} out of range (the pool has {})", who, b, num_blocks));
}

KvStaging::KvStaging(int device, int64_t block_bytes, int32_t max_blocks, int64_t max_bytes) {
  chunk_blocks_ =
      int32_t(std::clamp<int64_t>(max_bytes / std::max<int64_t>(block_bytes, 1), 1, std::max(max_blocks, 1)));
  TANDEM_CUDA_CHECK(cudaSetDevice(device));
  bytes_.resize(size_t(chunk_blocks_) * size_t(block_bytes));
  ids_.resize(size_t(chunk_blocks_));
}

const int32_t* KvStaging::upload(std::span<const int32_t> ids, cudaStream_t s) {
  if (ids.size() > size_t(chunk_blocks_)) throw std::logic_error("KvStaging: more ids than a chunk");
  if (!ids.empty())
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(ids_.get(), ids.data(), ids.size_bytes(), cudaMemcpyHostToDevice, s));
  return ids_.get();
}

DeviceStream::DeviceStream(int device) : device_(device) {
  TANDEM_CUDA_CHECK(cudaSetDevice(device));
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
}

DeviceStream::~DeviceStream() {
  (void)cudaSetDevice(device_);
  (void)cudaStreamDestroy(s_);
}

KvBlockMove::KvBlockMove(const KvPoolView& from, const KvPoolView& to, int64_t staging_bytes) : from_(from), to_(to) {
  if (from.layers != to.layers || from.layer_block_bytes != to.layer_block_bytes)
    throw std::invalid_argument(
        fmt::format("KV blocks differ in shape ({} layers of {} bytes vs {} of {}): prefill and decode need the same "
                    "model, block size and tensor parallelism",
                    from.layers, from.layer_block_bytes, to.layers, to.layer_block_bytes));
  const int32_t max_blocks = std::min(from.num_blocks, to.num_blocks);
  from_staging_ = std::make_unique<KvStaging>(from.device, from.block_bytes(), max_blocks, staging_bytes);
  from_stream_ = std::make_unique<DeviceStream>(from.device);
  if (!same_device()) {
    to_staging_ = std::make_unique<KvStaging>(to.device, to.block_bytes(), max_blocks, staging_bytes);
    to_stream_ = std::make_unique<DeviceStream>(to.device);
  }
}

void KvBlockMove::run(std::span<const int32_t> src, std::span<const int32_t> dst, const Carry& carry) {
  if (src.size() != dst.size()) throw std::logic_error("KvBlockMove: source and destination counts differ");
  const size_t chunk = size_t(from_staging_->chunk_blocks());
  const cudaStream_t fs = from_stream(), ts = to_stream();
  for (size_t i0 = 0; i0 < src.size(); i0 += chunk) {
    const size_t n = std::min(chunk, src.size() - i0);
    const size_t bytes = n * size_t(from_.block_bytes());
    TANDEM_CUDA_CHECK(cudaSetDevice(from_.device));
    pack_kv_blocks(from_, from_staging_->upload(src.subspan(i0, n), fs), int32_t(n), from_staging_->bytes(), fs);
    if (same_device()) {  // the same staging, the same stream: the unpack follows the pack
      unpack_kv_blocks(to_, from_staging_->upload(dst.subspan(i0, n), fs), int32_t(n), from_staging_->bytes(), fs);
      TANDEM_CUDA_CHECK(cudaStreamSynchronize(fs));
      continue;
    }
    if (carry)
      carry(from_staging_->bytes(), to_staging_->bytes(), bytes, fs, ts);
    else
      TANDEM_CUDA_CHECK(
          cudaMemcpyPeerAsync(to_staging_->bytes(), to_.device, from_staging_->bytes(), from_.device, bytes, fs));
    // A peer copy is ordered on the source's stream only: the unpack waits for it here. The
    // next chunk reuses both staging buffers, so the chunk ends when its unpack has run.
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(fs));
    TANDEM_CUDA_CHECK(cudaSetDevice(to_.device));
    unpack_kv_blocks(to_, to_staging_->upload(dst.subspan(i0, n), ts), int32_t(n), to_staging_->bytes(), ts);
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(ts));
  }
}

TransferStart run_kv_transfer(std::span<const std::unique_ptr<KvBlockMove>> ranks, const KvTransfer& t,
                              int64_t block_bytes, int32_t src_blocks, int32_t dst_blocks, const std::string& channel,
                              const KvBlockMove::Carry& carry) {
  TransferStart r;
  const auto t0 = std::chrono::steady_clock::now();
  if (t.src_blocks.size() != t.dst_blocks.size()) {
    r.ok = false;
    r.error = fmt::format("{} channel: {} source blocks for {} destination blocks", channel, t.src_blocks.size(),
                          t.dst_blocks.size());
    return r;
  }
  check_block_ids(t.src_blocks, src_blocks, (channel + " channel (prefill blocks)").c_str());
  check_block_ids(t.dst_blocks, dst_blocks, (channel + " channel (decode blocks)").c_str());
  for (const auto& rank : ranks) rank->run(t.src_blocks, t.dst_blocks, carry);
  r.bytes = int64_t(t.src_blocks.size()) * block_bytes;
  r.elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace tandem::cuda
