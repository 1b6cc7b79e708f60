// The pack and unpack kernels of kv_blocks.h: one thread block per (block, layer, K or V),
// copying that piece in 16-byte words (a piece is block_size * kv_heads * head_dim bf16, a
// multiple of 64 bytes for the head sizes the attention kernels take).
#include <cstdint>
#include <stdexcept>

#include "backend/cuda/check.h"
#include "backend/cuda/kv_blocks.h"

namespace tandem::cuda {

namespace {

constexpr int kThreads = 256;

// piece: (i * layers + l) * 2 + half, the packed order; words: 16-byte words per piece.
template <bool kUnpack>
__global__ void kv_pack_kernel(uint4* k, uint4* v, int64_t layer_words, int64_t words, int32_t layers,
                               const int32_t* blocks, uint4* packed) {
  const int64_t piece = blockIdx.x;
  const int32_t half = int32_t(piece & 1);
  const int64_t il = piece >> 1;
  const int32_t l = int32_t(il % layers);
  const int64_t i = il / layers;
  uint4* pool = (half ? v : k) + int64_t(l) * layer_words + int64_t(blocks[i]) * words;
  uint4* buf = packed + piece * words;
  for (int64_t w = threadIdx.x; w < words; w += kThreads) {
    if constexpr (kUnpack)
      pool[w] = buf[w];
    else
      buf[w] = pool[w];
  }
}

template <bool kUnpack>
void launch(const KvPoolView& pool, const int32_t* blocks, int32_t n, std::byte* packed, cudaStream_t s) {
  if (n == 0) return;
  if (pool.layer_block_bytes % 16 != 0)
    throw std::logic_error("kv_pack: a block's layer piece is not a multiple of 16 bytes");
  const int64_t words = pool.layer_block_bytes / 16;
  const int64_t pieces = int64_t(n) * pool.layers * 2;
  if (pieces > INT32_MAX) throw std::logic_error("kv_pack: too many blocks for one launch (move them in chunks)");
  kv_pack_kernel<kUnpack><<<unsigned(pieces), kThreads, 0, s>>>(
      reinterpret_cast<uint4*>(pool.k), reinterpret_cast<uint4*>(pool.v), words * pool.num_blocks, words, pool.layers,
      blocks, reinterpret_cast<uint4*>(packed));
  TANDEM_LAUNCH_CHECK("kv_pack_kernel");
}

}  // namespace

void pack_kv_blocks(const KvPoolView& pool, const int32_t* blocks, int32_t n, std::byte* packed, cudaStream_t s) {
  launch<false>(pool, blocks, n, packed, s);
}

void unpack_kv_blocks(const KvPoolView& pool, const int32_t* blocks, int32_t n, const std::byte* packed,
                      cudaStream_t s) {
  launch<true>(pool, blocks, n, const_cast<std::byte*>(packed), s);  // read only when unpacking
}

}  // namespace tandem::cuda
