// What both attention kernels share: loading one tile of keys and values of one KV head
// from the paged cache into shared memory. Keys past the tile's last query position are
// zeros, never read from the cache (their slots may not exist yet).
#pragma once
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"  // AttentionArgs

namespace tandem::cuda {

// What both launchers derive from the shapes: a block per (tile, KV head), the GQA group
// (at most max_group query heads per KV head) and the softmax scale.
struct AttentionLaunch {
  dim3 grid;
  int32_t group;
  float scale;
};
inline AttentionLaunch attention_launch(const AttentionArgs& a, int32_t max_group, const char* kernel) {
  const int32_t group = a.heads / a.kv_heads;
  if (group > max_group) fail(kernel, "too many query heads per KV head for this kernel", __FILE__, __LINE__);
  return {dim3{unsigned(a.n_tiles), unsigned(a.kv_heads), 1u}, group, 1.0f / std::sqrt(float(a.head_dim))};
}

// Calls f(std::integral_constant<int, HD>) for the head sizes the kernels are built for.
template <class F>
void with_head_dim(int32_t head_dim, const char* kernel, F&& f) {
  switch (head_dim) {
    case 32: f(std::integral_constant<int, 32>{}); break;
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 128: f(std::integral_constant<int, 128>{}); break;
    default: fail(kernel, "head_dim must be 32, 64 or 128", __FILE__, __LINE__);
  }
}

// A tile's query rows of KV head g (tokens x the heads of the group, fp32) into q_s, zeros
// past its rows. All kThreads threads of the block take part.
template <int HD, int kRows, int kThreads>
__device__ __forceinline__ void load_q(float (*q_s)[HD], const float* qkv, int64_t qkv_stride,
                                       const AttentionTile& tile, int g, int group, int tid) {
  const int rows = tile.n * group;
  for (int i = tid; i < kRows * HD; i += kThreads) {
    const int r = i / HD, d = i % HD;
    float v = 0.0f;
    if (r < rows) v = qkv[int64_t(tile.token0 + r / group) * qkv_stride + int64_t(g * group + r % group) * HD + d];
    q_s[r][d] = v;
  }
}

// One key's score before scaling: a query row (fp32, shared memory) dotted with a cached key
// row (bf16, shared memory, 4-byte aligned) over the head in ascending order, two dims a step.
template <int HD>
__device__ __forceinline__ float key_dot(const float* q, const __nv_bfloat16* k_row) {
  const __nv_bfloat162* k2 = reinterpret_cast<const __nv_bfloat162*>(k_row);
  float dot = 0.0f;
#pragma unroll 8
  for (int d2 = 0; d2 < HD / 2; ++d2) {
    const float2 kf = __bfloat1622float2(k2[d2]);
    dot = fmaf(q[2 * d2], kf.x, dot);
    dot = fmaf(q[2 * d2 + 1], kf.y, dot);
  }
  return dot;
}

// a + sum_j p[j] * v[j][d] over a tile's kKeys keys in ascending j (v rows of HD bf16).
template <int HD, int kKeys>
__device__ __forceinline__ float weighted_values(const float* p, const __nv_bfloat16 (*v)[HD], int d, float a) {
  for (int j = 0; j < kKeys; ++j) a = fmaf(p[j], __bfloat162float(v[j][d]), a);
  return a;
}

// Stores 8 bf16 (16 bytes) at p; rows of ld elements that are not a multiple of 16 bytes
// (padded against bank conflicts) take four 4-byte stores.
template <int kLd>
__device__ __forceinline__ void store_chunk(__nv_bfloat16* p, uint4 v) {
  if constexpr ((kLd * 2) % 16 == 0) {
    *reinterpret_cast<uint4*>(p) = v;
  } else {
    uint32_t* d = reinterpret_cast<uint32_t*>(p);
    d[0] = v.x;
    d[1] = v.y;
    d[2] = v.z;
    d[3] = v.w;
  }
}

// Keys kt*kKeys .. kt*kKeys + kKeys - 1 of KV head g: K rows into k_s (row stride kLdK),
// V rows into v_s (kLdV). All kThreads threads of the block take part.
template <int HD, int kKeys, int kThreads, int kLdK, int kLdV>
__device__ __forceinline__ void load_kv_tile(__nv_bfloat16* k_s, __nv_bfloat16* v_s, const __nv_bfloat16* k_cache,
                                             const __nv_bfloat16* v_cache, const int32_t* table, int32_t block_size,
                                             int32_t kv_heads, int g, int kt, int last_pos, int tid) {
  constexpr int kChunks = HD / 8;  // 16-byte chunks per key row
  for (int i = tid; i < kKeys * kChunks; i += kThreads) {
    const int j = i / kChunks, c = i % kChunks, key = kt * kKeys + j;
    uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
    if (key <= last_pos) {
      const int64_t slot = int64_t(table[key / block_size]) * block_size + key % block_size;
      const int64_t off = (slot * kv_heads + g) * HD + c * 8;
      kv = *reinterpret_cast<const uint4*>(k_cache + off);
      vv = *reinterpret_cast<const uint4*>(v_cache + off);
    }
    store_chunk<kLdK>(k_s + j * kLdK + c * 8, kv);
    store_chunk<kLdV>(v_s + j * kLdV + c * 8, vv);
  }
}

}  // namespace tandem::cuda
