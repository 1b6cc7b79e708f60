// Split-KV paged attention on the tensor cores (engine.cuda_attention: mma_split): the split-KV
// function of attention_split.cu (fixed splits of 64 keys by absolute position, a fresh partial
// softmax per split, the partials folded in split order) with the products of attention_mma.cu:
// per split, S = Q K^T and O = P V by WMMA (bf16 Q and P, fp32 accumulation). Long prefills
// run on the tensor cores, and decode spreads its splits over the GPU. A function of its own:
// not split's bits (Q and P are rounded to bf16) and not mma's (mma carries one running softmax
// from tile to tile; here each split's softmax starts fresh and the partials fold).
//
// A block takes up to 64 query rows of one sequence (tokens x the heads of one KV group), 16 per
// warp, a lane pair per row (each lane owns half of the head's output dims). The two ways, spread
// (a work item per split and tile, then split_kv::split_combine_kernel) and in-block (a block
// walks its splits), share mma_split_partial and the fold: the same bits (the cuda suite checks).
#include <mma.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/attention_split.cuh"
#include "backend/cuda/attention_tile.cuh"
#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"

namespace tandem::cuda {

namespace {

using namespace mma_tile;  // kWarps, kRows (64), kKeys (64), MmaLayout, mma_scores, mma_pv
using namespace split_kv;  // kSplitKeys, fold_scalars, fold_dim, finish, partial_at, split_combine_kernel

constexpr int kThreads = 32 * kWarps;
constexpr unsigned kFull = 0xffffffffu;
static_assert(kKeys == kSplitKeys, "a split is one key tile");

// A block's shared memory (MmaLayout), and this warp's P and scratch rows in it.
template <int HD>
struct Smem {
  bf16 *q_s, *k_s, *v_s, *p_w;
  float* s_w;
};
template <int HD>
__device__ __forceinline__ Smem<HD> carve(unsigned char* smem, int warp) {
  using L = MmaLayout<HD>;
  Smem<HD> m;
  m.q_s = reinterpret_cast<bf16*>(smem);
  m.k_s = reinterpret_cast<bf16*>(smem + L::kQ);
  m.v_s = reinterpret_cast<bf16*>(smem + L::kQ + L::kK);
  m.p_w = reinterpret_cast<bf16*>(smem + L::kQ + L::kK + L::kV) + size_t(warp) * 16 * L::kLdP;
  m.s_w = reinterpret_cast<float*>(smem + L::kQ + L::kK + L::kV + L::kP) + size_t(warp) * 16 * L::kLdS;
  return m;
}

// The tile's query rows of KV head g as bf16 into q_s (zeros past its rows).
template <int HD>
__device__ __forceinline__ void load_q_bf16(bf16* q_s, const float* qkv, int64_t qkv_stride, const AttentionTile& tile,
                                            int g, int group, int tid) {
  using L = MmaLayout<HD>;
  const int rows = tile.n * group;
  for (int i = tid; i < kRows * HD; i += kThreads) {
    const int r = i / HD, d = i % HD;
    float v = 0.0f;
    if (r < rows) v = qkv[int64_t(tile.token0 + r / group) * qkv_stride + int64_t(g * group + r % group) * HD + d];
    q_s[r * L::kLd + d] = __float2bfloat16(v);
  }
}

// Where this lane's row stands in a tile: its row, whether it exists, its position, and the
// last position of any row of its warp (a warp past it skips the split).
struct LaneRow {
  int row, pos, warp_last_pos;
  bool valid;
};
__device__ __forceinline__ LaneRow lane_row(const AttentionTile& tile, int group, int warp, int lane) {
  const int rows = tile.n * group;
  LaneRow r;
  r.row = warp * 16 + lane / 2;
  r.valid = r.row < rows;
  r.pos = tile.pos0 + r.row / group;
  const int warp_rows = rows - warp * 16;
  r.warp_last_pos = warp_rows > 0 ? tile.pos0 + (warp * 16 + (warp_rows < 16 ? warp_rows : 16) - 1) / group : -1;
  return r;
}

// One split (the key tile in k_s, v_s) for this warp's 16 rows: returns the row's max and sum
// (x, y; the same in both lanes of a pair) and leaves its unnormalised P V in the warp's
// scratch (row lane / 2), to be read before the next __syncwarp. Every lane takes part (WMMA
// is warp-wide); `active` (the row exists and reaches the split) gates only its arithmetic.
template <int HD>
__device__ __forceinline__ float2 mma_split_partial(const Smem<HD>& sm, int warp, int lane, int split, int pos,
                                                    bool active, float scale) {
  using L = MmaLayout<HD>;
  const int row_in_warp = lane / 2, half = lane % 2;
  mma_scores<HD>(sm.q_s, warp, sm.k_s, sm.s_w);
  __syncwarp();
  float s[32], mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int key = split * kKeys + half * 32 + j;
    s[j] = key <= pos ? __fmul_rn(sm.s_w[row_in_warp * L::kLdS + half * 32 + j], scale) : -INFINITY;
    mx = fmaxf(mx, s[j]);
  }
  mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const float p = active ? expf(__fsub_rn(s[j], mx)) : 0.0f;
    sum = __fadd_rn(sum, p);
    sm.p_w[row_in_warp * L::kLdP + half * 32 + j] = __float2bfloat16(p);
  }
  sum = __fadd_rn(sum, __shfl_xor_sync(kFull, sum, 1));  // a + b on one lane, b + a on the other: the same
  __syncwarp();
  mma_pv<HD>(sm.p_w, sm.v_s, sm.s_w);
  __syncwarp();
  return make_float2(mx, sum);
}

// In-block: a block per (tile, KV head) walks the splits its last row reaches, folding as it goes.
template <int HD>
__global__ void __launch_bounds__(kThreads)
    mma_split_inblock_kernel(const float* qkv, int64_t qkv_stride, const bf16* k_cache, const bf16* v_cache,
                             const int32_t* block_tables, int32_t table_width, int32_t block_size,
                             const AttentionTile* tiles, int32_t heads, int32_t kv_heads, int32_t group, float scale,
                             bf16* out) {
  using L = MmaLayout<HD>;
  constexpr int kHalfDims = HD / 2;
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, half = lane % 2;
  const Smem<HD> sm = carve<HD>(smem, warp);
  const AttentionTile tile = tiles[blockIdx.x];
  if (tile.n == 0) return;  // padding
  const int g = int(blockIdx.y);
  load_q_bf16<HD>(sm.q_s, qkv, qkv_stride, tile, g, group, tid);
  const LaneRow lr = lane_row(tile, group, warp, lane);
  float M = -INFINITY, Lsum = 0.0f, o[kHalfDims];
#pragma unroll
  for (int i = 0; i < kHalfDims; ++i) o[i] = 0.0f;
  const int last_pos = tile.pos0 + tile.n - 1;
  const int32_t* table = block_tables + int64_t(tile.seq) * table_width;
  for (int split = 0; split <= last_pos / kKeys; ++split) {
    __syncthreads();  // the previous split is consumed (and q_s is written)
    load_kv_tile<HD, kKeys, kThreads, L::kLd, L::kLd>(sm.k_s, sm.v_s, k_cache, v_cache, table, block_size, kv_heads, g,
                                                      split, last_pos, tid);
    __syncthreads();
    if (split * kKeys > lr.warp_last_pos) continue;  // warp-uniform: every row of this warp ended earlier
    const bool active = lr.valid && split * kKeys <= lr.pos;
    const float2 ml = mma_split_partial<HD>(sm, warp, lane, split, lr.pos, active, scale);
    if (active) {
      float alpha, beta;
      fold_scalars(M, Lsum, ml.x, ml.y, alpha, beta);
#pragma unroll
      for (int i = 0; i < kHalfDims; ++i)
        o[i] = fold_dim(o[i], sm.s_w[(lane / 2) * L::kLdS + half * kHalfDims + i], alpha, beta);
    }
    __syncwarp();  // the scratch is rewritten by the next split
  }
  if (!lr.valid) return;
  bf16* dst = out + int64_t(tile.token0 + lr.row / group) * heads * HD + int64_t(g * group + lr.row % group) * HD +
              half * kHalfDims;
#pragma unroll
  for (int i = 0; i < kHalfDims; ++i) dst[i] = finish(o[i], Lsum);
}

// Spread: work item i of n_tiles * max_splits is (split i / n_tiles, tile i % n_tiles), as in
// attention_split.cu; each writes its rows' partials to the workspace.
template <int HD>
__global__ void __launch_bounds__(kThreads)
    mma_split_partials_kernel(const float* qkv, int64_t qkv_stride, const bf16* k_cache, const bf16* v_cache,
                              const int32_t* block_tables, int32_t table_width, int32_t block_size,
                              const AttentionTile* tiles, int32_t n_tiles, int32_t max_splits, int32_t heads,
                              int32_t kv_heads, int32_t group, float scale, float* ws) {
  using L = MmaLayout<HD>;
  constexpr int kHalfDims = HD / 2;
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, half = lane % 2;
  const Smem<HD> sm = carve<HD>(smem, warp);
  const int g = int(blockIdx.y);
  const int64_t items = int64_t(n_tiles) * max_splits;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    int split;
    AttentionTile tile;
    if (!spread_item(item, n_tiles, tiles, split, tile)) continue;  // block-uniform
    const int last_pos = tile.pos0 + tile.n - 1;
    __syncthreads();  // the previous item's tiles are consumed
    load_q_bf16<HD>(sm.q_s, qkv, qkv_stride, tile, g, group, tid);
    load_kv_tile<HD, kKeys, kThreads, L::kLd, L::kLd>(sm.k_s, sm.v_s, k_cache, v_cache,
                                                      block_tables + int64_t(tile.seq) * table_width, block_size,
                                                      kv_heads, g, split, last_pos, tid);
    __syncthreads();
    const LaneRow lr = lane_row(tile, group, warp, lane);
    if (split * kKeys > lr.warp_last_pos) continue;  // warp-uniform
    const bool active = lr.valid && split * kKeys <= lr.pos;
    const float2 ml = mma_split_partial<HD>(sm, warp, lane, split, lr.pos, active, scale);
    if (active) {
      const int64_t row = int64_t(tile.token0 + lr.row / group) * heads + g * group + lr.row % group;
      float* p = partial_at(ws, row, max_splits, split, HD);
#pragma unroll
      for (int i = 0; i < kHalfDims; ++i) p[half * kHalfDims + i] = sm.s_w[(lane / 2) * L::kLdS + half * kHalfDims + i];
      if (half == 0) {
        p[HD] = ml.x;
        p[HD + 1] = ml.y;
      }
    }
    __syncwarp();  // the scratch is rewritten by the next item
  }
}

// The opt-in to more than 48 KB of shared memory is per function and device: once each.
template <class Kernel>
void allow_shared(Kernel kernel, size_t bytes, bool (&configured)[64]) {
  int device = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 64 && configured[device]) return;
  TANDEM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  if (device < 64) configured[device] = true;
}

template <int HD>
void launch_mma_split(const AttentionArgs& a, const AttentionLaunch& l, cudaStream_t s) {
  constexpr size_t bytes = MmaLayout<HD>::kBytes;
  static bool inblock_ok[64] = {}, partials_ok[64] = {};
  if (!attention_split_spreads(a)) {
    allow_shared(mma_split_inblock_kernel<HD>, bytes, inblock_ok);
    mma_split_inblock_kernel<HD><<<l.grid, kThreads, bytes, s>>>(a.qkv, a.qkv_stride, a.k_cache, a.v_cache,
                                                                 a.block_tables, a.table_width, a.block_size, a.tiles,
                                                                 a.heads, a.kv_heads, l.group, l.scale, a.out);
    TANDEM_LAUNCH_CHECK("mma_split_inblock_kernel");
    return;
  }
  allow_shared(mma_split_partials_kernel<HD>, bytes, partials_ok);
  const int32_t max_splits = attention_split_max_splits(a.max_positions);
  const dim3 grid = spread_grid(a, max_splits);
  mma_split_partials_kernel<HD><<<grid, kThreads, bytes, s>>>(
      a.qkv, a.qkv_stride, a.k_cache, a.v_cache, a.block_tables, a.table_width, a.block_size, a.tiles, a.n_tiles,
      max_splits, a.heads, a.kv_heads, l.group, l.scale, a.split_workspace);
  TANDEM_LAUNCH_CHECK("mma_split_partials_kernel");
  split_combine_kernel<HD>
      <<<l.grid, kCombineThreads, 0, s>>>(a.tiles, max_splits, a.heads, l.group, a.split_workspace, a.out);
  TANDEM_LAUNCH_CHECK("split_combine_kernel");
}

}  // namespace

void paged_attention_mma_split(const AttentionArgs& a, cudaStream_t s) {
  if (a.n_tiles == 0) return;
  const AttentionLaunch l = attention_launch(a, kRows, "paged_attention_mma_split");
  with_head_dim(a.head_dim, "paged_attention_mma_split", [&](auto hd) { launch_mma_split<hd>(a, l, s); });
}

}  // namespace tandem::cuda
