// Whole KV blocks in and out of one rank's pool on its GPU (stage 4): what the executor's
// kv_store_i and the device channels (cuda_channels.h, nccl_channel.h) are built from. A pack
// kernel gathers blocks into a contiguous buffer, an unpack kernel scatters one back.
//
// The packed layout of n blocks: block i at i * pool.block_bytes(); inside a block, layer by
// layer, K then V. That is one rank's part of a kv_store_i block, so the host buffer of a
// TP-split model is each block's ranks side by side (CudaModel::read_kv_blocks).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "backend/cuda/buffer.h"
#include "backend/cuda/kv_pool_view.h"
#include "backend/transfer/channel.h"

namespace tandem::cuda {

// blocks: n ids in device memory, each in [0, pool.num_blocks) (checked by the caller: see
// check_block_ids). Enqueued on `s`, whose device holds the pool and the packed buffer.
void pack_kv_blocks(const KvPoolView& pool, const int32_t* blocks, int32_t n, std::byte* packed, cudaStream_t s);
void unpack_kv_blocks(const KvPoolView& pool, const int32_t* blocks, int32_t n, const std::byte* packed,
                      cudaStream_t s);

// Throws std::invalid_argument naming `who` for an id outside [0, num_blocks).
void check_block_ids(std::span<const int32_t> blocks, int32_t num_blocks, const char* who);

// A GPU's scratch for moving blocks: the ids and the packed bytes of one chunk. A transfer moves
// in chunks of at most max_bytes (and at least one block), so the scratch stays small whatever
// the prompt. Allocated at construction on `device` (which it leaves current).
class KvStaging {
 public:
  static constexpr int64_t kBytes = int64_t{64} << 20;
  // max_blocks: the most a transfer can hold (the pool's blocks), so a small pool stays small.
  KvStaging(int device, int64_t block_bytes, int32_t max_blocks, int64_t max_bytes = kBytes);
  int32_t chunk_blocks() const { return chunk_blocks_; }
  std::byte* bytes() const { return bytes_.get(); }
  // Enqueues the ids' upload on `s` (the staging's device must be current) and returns them in
  // device memory. Stream order protects the previous chunk's ids until its kernel has run.
  const int32_t* upload(std::span<const int32_t> ids, cudaStream_t s);

 private:
  int32_t chunk_blocks_ = 1;
  DeviceBuffer<std::byte> bytes_;
  DeviceBuffer<int32_t> ids_;
};

// A stream of its own on one GPU, destroyed with its owner.
class DeviceStream {
 public:
  explicit DeviceStream(int device);  // leaves `device` current
  ~DeviceStream();
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  int device_ = 0;
  cudaStream_t s_ = nullptr;
};

// Blocks from one rank's pool to another's, the same layout (the device channels): packed on the
// source's GPU, carried to the destination GPU's staging (nothing to carry when both pools share
// a GPU), unpacked there. Chunk by chunk; run() returns when the last chunk is written.
class KvBlockMove {
 public:
  // Enqueues one chunk's bytes from the source's staging (on from_stream, after the pack) into the
  // destination's (on to_stream, before the unpack): a peer copy, or an NCCL send/recv.
  using Carry = std::function<void(const std::byte* from, std::byte* to, size_t bytes, cudaStream_t from_stream,
                                   cudaStream_t to_stream)>;
  // Throws std::invalid_argument if the pools' blocks differ in shape. staging_bytes: the chunk.
  KvBlockMove(const KvPoolView& from, const KvPoolView& to, int64_t staging_bytes = KvStaging::kBytes);
  bool same_device() const { return from_.device == to_.device; }
  // Ids already checked; src.size() == dst.size(). `carry` unused on one GPU; empty: a peer copy.
  void run(std::span<const int32_t> src, std::span<const int32_t> dst, const Carry& carry = {});
  // Both staging buffers, for a carrier's warm-up (NCCL sets up its connection on the first send).
  std::byte* from_bytes() const { return from_staging_->bytes(); }
  std::byte* to_bytes() const { return to_staging_ ? to_staging_->bytes() : nullptr; }
  cudaStream_t from_stream() const { return from_stream_->get(); }
  cudaStream_t to_stream() const { return to_stream_ ? to_stream_->get() : nullptr; }

 private:
  KvPoolView from_, to_;
  std::unique_ptr<KvStaging> from_staging_, to_staging_;  // the to_ side's: only across GPUs
  std::unique_ptr<DeviceStream> from_stream_, to_stream_;
};

// A device channel's start(): checks the transfer against the pools (as CopyChannel: a count
// mismatch fails the transfer, a bad id throws), moves every rank's share with its mover, and
// reports the measured time and the bytes of all ranks. `channel` names the channel in errors.
TransferStart run_kv_transfer(std::span<const std::unique_ptr<KvBlockMove>> ranks, const KvTransfer& t,
                              int64_t block_bytes, int32_t src_blocks, int32_t dst_blocks, const std::string& channel,
                              const KvBlockMove::Carry& carry = {});

}  // namespace tandem::cuda
