// What both split-KV attention kernels share (attention_split.cu on the CUDA cores,
// attention_mma_split.cu on the tensor cores): the fold of split partials, where a partial
// lives in the workspace, and the combine kernel of the spread way. The fold is the function's
// definition, so every operation is written out (_rn intrinsics, fmaf): the in-block and the
// spread ways compile it to the same arithmetic.
#pragma once
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"

namespace tandem::cuda::split_kv {

constexpr int kSplitKeys = 64;  // keys per split, by absolute position
constexpr int kCombineThreads = 128;

// Folds split partial (m, l, acc) into the running state: the one definition both ways use.
__device__ __forceinline__ void fold_scalars(float& M, float& L, float m, float l, float& alpha, float& beta) {
  const float m_new = fmaxf(M, m);
  alpha = expf(__fsub_rn(M, m_new));  // 0 on the first split (M = -inf)
  beta = expf(__fsub_rn(m, m_new));
  L = fmaf(l, beta, __fmul_rn(L, alpha));
  M = m_new;
}
__device__ __forceinline__ float fold_dim(float A, float acc, float alpha, float beta) {
  return fmaf(acc, beta, __fmul_rn(A, alpha));
}
__device__ __forceinline__ __nv_bfloat16 finish(float A, float L) { return __float2bfloat16(__fmul_rn(A, 1.0f / L)); }

// Where a row's partial of split s lives: [query row = token * heads + head][split][HD + 2]
// (acc, then m and l).
template <class F>
__device__ __forceinline__ F* partial_at(F* ws, int64_t row, int32_t max_splits, int s, int hd) {
  return ws + (row * max_splits + s) * (hd + 2);
}

// Spread, second kernel: a block per (tile, KV head) folds each row's partials in split order.
template <int HD>
__global__ void __launch_bounds__(kCombineThreads)
    split_combine_kernel(const AttentionTile* tiles, int32_t max_splits, int32_t heads, int32_t group, const float* ws,
                         __nv_bfloat16* out) {
  const AttentionTile tile = tiles[blockIdx.x];
  if (tile.n == 0) return;
  const int g = int(blockIdx.y);
  const int rows = tile.n * group;
  for (int i = int(threadIdx.x); i < rows * HD; i += kCombineThreads) {
    const int r = i / HD, d = i % HD;
    const int pos = tile.pos0 + r / group;
    const int64_t row = int64_t(tile.token0 + r / group) * heads + g * group + r % group;
    float M = -INFINITY, L = 0.0f, A = 0.0f;
    for (int s = 0; s <= pos / kSplitKeys; ++s) {
      const float* p = partial_at(ws, row, max_splits, s, HD);
      float alpha, beta;
      fold_scalars(M, L, p[HD], p[HD + 1], alpha, beta);
      A = fold_dim(A, p[d], alpha, beta);
    }
    out[row * HD + d] = finish(A, L);
  }
}

inline int sm_count() {
  static const int n = [] {
    int device = 0, count = 0;
    TANDEM_CUDA_CHECK(cudaGetDevice(&device));
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  }();
  return n;
}

// The spread way's partials grid: (work items, KV heads), up to 8 blocks per SM in all. Fixed
// by the launch's shape, not by the data, so a graph captured once serves every context
// length up to max_positions; blocks stride over the n_tiles * max_splits items.
inline dim3 spread_grid(const AttentionArgs& a, int32_t max_splits) {
  const int64_t items = int64_t(a.n_tiles) * max_splits;
  const int64_t per_head = (8 * int64_t(sm_count()) + a.kv_heads - 1) / a.kv_heads;
  return dim3{unsigned(items < per_head ? items : (per_head > 0 ? per_head : 1)), unsigned(a.kv_heads), 1u};
}

// Work item `item` of the spread way: (split item / n_tiles, tile item % n_tiles), split first
// so that the items that exist come first and spread over the blocks. False for an item with
// nothing to do (a padding tile, or a split past the tile's last position): block-uniform.
__device__ __forceinline__ bool spread_item(int64_t item, int32_t n_tiles, const AttentionTile* tiles, int& split,
                                            AttentionTile& tile) {
  split = int(item / n_tiles);
  tile = tiles[item % n_tiles];
  return tile.n != 0 && split * kSplitKeys <= tile.pos0 + tile.n - 1;
}

}  // namespace tandem::cuda::split_kv
