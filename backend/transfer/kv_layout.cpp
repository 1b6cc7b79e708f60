#include "backend/transfer/kv_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace tandem {

int32_t KvLayout::element_bytes() const {
  if (dtype == "fp32") return 4;
  if (dtype == "bf16" || dtype == "fp16") return 2;
  if (dtype == "fp8") return 1;
  return 0;
}

int64_t KvLayout::block_bytes() const {
  return 2 * int64_t(layers) * block_size * kv_heads * head_dim * element_bytes();
}

std::string model_identity(const ModelSpec& m) {
  return fmt::format("{} ({} layers, hidden {}, {} heads, {} KV heads, ffn {}, vocab {}, rope {}, eps {}{})", m.name,
                     m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.vocab, m.rope_theta, m.rms_norm_eps,
                     m.tie_embeddings ? ", tied embeddings" : "");
}

KvLayout llama_kv_layout(const ModelSpec& m, std::string weights, std::string dtype, int32_t block_size, int32_t tp) {
  return {.model = model_identity(m),
          .weights = std::move(weights),
          .dtype = std::move(dtype),
          .block_size = block_size,
          .layers = m.layers,
          .kv_heads = m.kv_heads,
          .head_dim = m.head_dim(),
          .tp = tp,
          .order = kKvOrderRankLayerKv};
}

std::string describe(const KvLayout& l) {
  return fmt::format("{}, weights {}, {}, {}-token blocks, {} layers x {} KV heads x {}, TP {}{}", l.model, l.weights,
                     l.dtype, l.block_size, l.layers, l.kv_heads, l.head_dim, l.tp,
                     l.order == kKvOrderRankLayerKv ? "" : fmt::format(", order {}", l.order));
}

KvLayoutCheck check_kv_layouts(const KvLayout& from, const KvLayout& to) {
  std::vector<std::string> differ;
  const auto field = [&](bool same, const char* name) {
    if (!same) differ.push_back(name);
  };
  field(from.model == to.model, "model");
  field(from.weights == to.weights, "weights");
  field(from.dtype == to.dtype, "dtype");
  field(from.block_size == to.block_size, "block size");
  field(from.layers == to.layers, "layers");
  field(from.kv_heads == to.kv_heads, "KV heads");
  field(from.head_dim == to.head_dim, "head size");
  field(from.order == to.order && from.order == kKvOrderRankLayerKv, "block order");
  const auto splits = [](const KvLayout& l) { return l.tp >= 1 && l.kv_heads > 0 && l.kv_heads % l.tp == 0; };
  field(splits(from) && splits(to), "tensor parallelism (it must divide the KV heads)");
  field(from.element_bytes() > 0, "dtype (unknown)");
  if (!differ.empty()) {
    std::string list;
    for (const std::string& d : differ) list += (list.empty() ? "" : ", ") + d;
    return {KvLayoutMatch::Incompatible,
            fmt::format("the KV blocks differ in {} (prefill: {}; decode: {})", list, describe(from), describe(to))};
  }
  if (from.tp != to.tp) return {KvLayoutMatch::Relayout, {}};
  return {KvLayoutMatch::Same, {}};
}

void relayout_kv_blocks(const KvLayout& from, const KvLayout& to, std::span<const std::byte> in,
                        std::span<std::byte> out) {
  const KvLayoutCheck c = check_kv_layouts(from, to);
  if (c.match == KvLayoutMatch::Incompatible) throw std::invalid_argument("relayout_kv_blocks: " + c.why);
  const int64_t bb = from.block_bytes();
  if (bb <= 0 || int64_t(in.size()) % bb != 0 || in.size() != out.size())
    throw std::invalid_argument(fmt::format("relayout_kv_blocks: {} bytes in, {} out, blocks of {} bytes", in.size(),
                                            out.size(), bb));
  if (c.match == KvLayoutMatch::Same) {
    std::memcpy(out.data(), in.data(), in.size());
    return;
  }
  // Every (layer, K or V, slot) row holds the KV heads of one rank; a run of heads that stays on
  // one rank on both sides moves with one copy.
  const int64_t head_bytes = int64_t(from.head_dim) * from.element_bytes();
  const int32_t H = from.kv_heads, ha = H / from.tp, hb = H / to.tp;
  const int64_t rows = 2 * int64_t(from.layers) * from.block_size;  // (layer, kv, slot) in that order
  const int64_t rank_a = rows * ha * head_bytes, rank_b = rows * hb * head_bytes;
  const int64_t blocks = int64_t(in.size()) / bb;
  for (int64_t i = 0; i < blocks; ++i) {
    const std::byte* src = in.data() + i * bb;
    std::byte* dst = out.data() + i * bb;
    for (int64_t row = 0; row < rows; ++row)
      for (int32_t h = 0; h < H;) {
        const int32_t ra = h / ha, la = h % ha, rb = h / hb, lb = h % hb;
        const int32_t run = std::min(ha - la, hb - lb);
        std::memcpy(dst + rb * rank_b + (row * hb + lb) * head_bytes, src + ra * rank_a + (row * ha + la) * head_bytes,
                    size_t(run * head_bytes));
        h += run;
      }
  }
}

}  // namespace tandem
