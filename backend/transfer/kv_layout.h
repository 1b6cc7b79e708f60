// How a real backend's KV block is laid out, as the channels of prefill/decode separation see it.
// Each side describes its own blocks; the two descriptors are compared before any block moves
// (the copy channel at construction, the tcp channel in Hello and HelloOk), so blocks of one
// layout are never written into a pool of another. Where the two differ only by tensor
// parallelism (the same model, dtype and block shape, the KV heads split over another number of
// ranks), the receiver re-lays the blocks out; anything else is refused before work, naming both
// sides. (DistServe runs prefill at TP 2 and decode at TP 1: a configuration to serve, not refuse.)
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "backend/specs.h"

namespace tandem {

// The only block order the backends use today: a block's bytes are its ranks side by side
// (rank r holds KV heads [r * kv_heads / tp, (r + 1) * kv_heads / tp)), in each rank layer
// after layer, K then V, each [slot][head][dim] (CPU: PagedKvStore; CUDA: kv_pack.cu).
inline constexpr const char* kKvOrderRankLayerKv = "block>rank>layer>kv>slot>head>dim";

struct KvLayout {
  std::string model;    // the model: name and shape (model_identity)
  std::string weights;  // what its weights are: a fingerprint of the values, or generator and seed
  std::string dtype;    // of the stored K and V: fp32 (CPU) or bf16 (CUDA)
  int32_t block_size = 0, layers = 0, kv_heads = 0, head_dim = 0, tp = 1;
  std::string order = kKvOrderRankLayerKv;

  int32_t element_bytes() const;  // 0 for an unknown dtype
  int64_t block_bytes() const;    // every rank's share of one block
  bool operator==(const KvLayout&) const = default;
};

// "tiny (4 layers, hidden 256, 8 heads, 4 KV heads, ffn 688, vocab 4096, rope 10000, eps 1e-05)":
// everything of the shape that changes what the KV holds.
std::string model_identity(const ModelSpec& m);
// A Llama-style model's KV layout on a backend that stores `dtype` (both backends store the
// blocks in kKvOrderRankLayerKv).
KvLayout llama_kv_layout(const ModelSpec& m, std::string weights, std::string dtype, int32_t block_size, int32_t tp);

// One line, for messages: "tiny (...), weights fp32 #1a2b..., fp32, 16-token blocks, 4 layers x 4 KV heads x 32, TP 2".
std::string describe(const KvLayout& l);

enum class KvLayoutMatch : uint8_t {
  Same,          // the bytes move as they are
  Relayout,      // the same KV split over another number of ranks: relayout_kv_blocks
  Incompatible,  // refused
};
struct KvLayoutCheck {
  KvLayoutMatch match = KvLayoutMatch::Same;
  std::string why;  // Incompatible: what differs, then both sides described
};
// Whether `from`'s blocks (the prefill side) can fill `to`'s (the decode side).
KvLayoutCheck check_kv_layouts(const KvLayout& from, const KvLayout& to);

// Rewrites in.size() / from.block_bytes() whole blocks from `from`'s layout into `to`'s
// (check_kv_layouts says Same or Relayout). Throws std::invalid_argument otherwise, or when a
// buffer is not a whole number of blocks of its layout.
void relayout_kv_blocks(const KvLayout& from, const KvLayout& to, std::span<const std::byte> in,
                        std::span<std::byte> out);

}  // namespace tandem
