// One rank's KV pool as plain pointers and sizes: what the block movers (kv_blocks.h) need of a
// model (cuda_model.h hands them out), in a header of its own so that kv_blocks.h does not
// include the model, whose source includes kv_blocks.h.
#pragma once
#include <cstddef>
#include <cstdint>

namespace tandem::cuda {

// One rank's share of the KV cache, for the code that moves whole blocks (kv_blocks.h): device
// memory on `device`, K and V each [layer][block][layer_block_bytes] (the model's own layout:
// [layer][block * block_size + slot][kv_heads][head_dim], bf16).
struct KvPoolView {
  int device = 0;
  std::byte* k = nullptr;
  std::byte* v = nullptr;
  int32_t layers = 0, num_blocks = 0;
  int64_t layer_block_bytes = 0;  // one block of one layer, K or V: block_size * kv_heads * head_dim * 2
  int64_t block_bytes() const { return 2 * int64_t(layers) * layer_block_bytes; }  // this rank's share of a block
};

}  // namespace tandem::cuda
