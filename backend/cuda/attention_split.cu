// Split-KV paged attention ("flash-decoding") on the CUDA cores: the variant for decode, where
// one block per KV head walking the whole context leaves the GPU almost idle (8 blocks on 132
// SMs at batch 1).
//
// The function it computes (engine.cuda_attention: split; a function of its own, like mma):
// a row at absolute position pos splits its keys into fixed splits of kSplitKeys = 64 tokens
// by absolute position (split s holds keys 64s .. 64s + 63). Each split gives a fresh partial
// softmax (its own max m_s, sum l_s and unnormalised P V, keys in ascending order); the
// partials are then folded in ascending split order, s = 0 .. pos / 64:
//     M' = max(M, m_s);  L = L e^(M - M') + l_s e^(m_s - M');  A = A e^(M - M') + acc_s e^(m_s - M')
// and the row's output is A / L. The split size is fixed in tokens, never chosen by the batch,
// and the fold order is the splits' order, so the result depends only on the row's position
// and the cached keys: batch- and chunk-invariant, as the other two kernels.
//
// It runs in one of two ways, bit for bit the same (the same device functions, every operation
// written out with _rn intrinsics or fmaf, so nothing is contracted differently):
//  - spread: one work item per (tile, split, KV head) over a grid of up to 8 blocks per SM,
//    partials to a workspace, then a combine kernel folds them per row. For small launches
//    (decode), where the splits are what fills the GPU.
//  - in-block: a block per (tile, KV head) walks its splits and folds as it goes. For launches
//    whose rows x splits do not fit the workspace (long prefills), which have blocks enough.
// paged_attention_split picks per launch; the tests check that both give the same bits.
#include <algorithm>
#include <cmath>

#include "backend/cuda/attention_split.cuh"
#include "backend/cuda/attention_tile.cuh"
#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"

namespace tandem::cuda {

namespace {

using namespace split_kv;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16;  // query rows per tile, as the SIMT kernel (attention_tile_tokens)
constexpr int kRowsPerWarp = kRows / kWarps;
constexpr int kKeys = split_kv::kSplitKeys;  // keys per split = keys per shared-memory tile: 2 per lane
constexpr unsigned kFull = 0xffffffffu;

// A row's softmax state: running max, sum and (per lane) its output dims, unnormalised.
template <int HD>
struct RowState {
  float m, l, acc[HD / 32];
};

// The partial of one split for one row (a warp): scores of the tile's 64 keys (keys past pos
// masked), their max, p = e^(s - max), l = sum p (xor tree), acc[d] = sum_j p_j v_j[d] in
// ascending j from zero. p_w: this warp's 64 floats of shared scratch.
template <int HD, int kPaddedK>
__device__ __forceinline__ RowState<HD> split_partial(const float* q_row, const bf16 (*k_s)[kPaddedK],
                                                      const bf16 (*v_s)[HD], float* p_w, int split, int pos,
                                                      float scale, int lane) {
  RowState<HD> st;
  float s[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int j = lane + 32 * half;
    const float dot = key_dot<HD>(q_row, &k_s[j][0]);
    s[half] = split * kKeys + j <= pos ? __fmul_rn(dot, scale) : -INFINITY;
  }
  float mx = fmaxf(s[0], s[1]);
#pragma unroll
  for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, o));
  st.m = mx;  // finite: key 64 * split <= pos is visible
  const float p0 = expf(__fsub_rn(s[0], mx)), p1 = expf(__fsub_rn(s[1], mx));
  float sum = __fadd_rn(p0, p1);
#pragma unroll
  for (int o = 16; o > 0; o /= 2) sum = __fadd_rn(sum, __shfl_xor_sync(kFull, sum, o));
  st.l = __shfl_sync(kFull, sum, 0);
  p_w[lane] = p0;
  p_w[lane + 32] = p1;
  __syncwarp();
#pragma unroll
  for (int c = 0; c < HD / 32; ++c) st.acc[c] = weighted_values<HD, kKeys>(p_w, v_s, lane + 32 * c, 0.0f);
  __syncwarp();  // p_w is rewritten by the next row
  return st;
}

template <int HD>
struct SharedTiles {
  static constexpr int kPaddedK = HD + 2;  // odd word stride: lanes reading one column hit distinct banks
  float q_s[kRows][HD];
  __align__(16) bf16 k_s[kKeys][kPaddedK];
  __align__(16) bf16 v_s[kKeys][HD];
  float p_s[kWarps][kKeys];
};

// Spread: work item i of n_tiles * max_splits is (split i / n_tiles, tile i % n_tiles), split
// first so that the items that exist (splits a row reaches) come first and spread over the
// blocks. An item beyond its tile's last position is skipped.
template <int HD>
__global__ void __launch_bounds__(kThreads)
    split_partials_kernel(const float* qkv, int64_t qkv_stride, const bf16* k_cache, const bf16* v_cache,
                          const int32_t* block_tables, int32_t table_width, int32_t block_size,
                          const AttentionTile* tiles, int32_t n_tiles, int32_t max_splits, int32_t heads,
                          int32_t kv_heads, int32_t group, float scale, float* ws) {
  __shared__ SharedTiles<HD> sh;
  const int g = int(blockIdx.y);
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int64_t items = int64_t(n_tiles) * max_splits;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    int split;
    AttentionTile tile;
    if (!spread_item(item, n_tiles, tiles, split, tile)) continue;  // block-uniform
    const int last_pos = tile.pos0 + tile.n - 1;
    __syncthreads();  // the previous item's tiles are consumed
    load_q<HD, kRows, kThreads>(sh.q_s, qkv, qkv_stride, tile, g, group, tid);
    load_kv_tile<HD, kKeys, kThreads, SharedTiles<HD>::kPaddedK, HD>(&sh.k_s[0][0], &sh.v_s[0][0], k_cache, v_cache,
                                                                     block_tables + int64_t(tile.seq) * table_width,
                                                                     block_size, kv_heads, g, split, last_pos, tid);
    __syncthreads();
    const int rows = tile.n * group;
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int r = warp + kWarps * i;
      if (r >= rows) continue;  // warp-uniform
      const int pos = tile.pos0 + r / group;
      if (split * kKeys > pos) continue;  // this row's keys ended in an earlier split
      const RowState<HD> st = split_partial<HD, SharedTiles<HD>::kPaddedK>(sh.q_s[r], sh.k_s, sh.v_s, sh.p_s[warp],
                                                                           split, pos, scale, lane);
      const int64_t row = int64_t(tile.token0 + r / group) * heads + g * group + r % group;
      float* p = partial_at(ws, row, max_splits, split, HD);
#pragma unroll
      for (int c = 0; c < HD / 32; ++c) p[lane + 32 * c] = st.acc[c];
      if (lane == 0) {
        p[HD] = st.m;
        p[HD + 1] = st.l;
      }
    }
  }
}

// In-block: a block per (tile, KV head) walks the splits its last row reaches and folds each
// row's partial as it goes.
template <int HD>
__global__ void __launch_bounds__(kThreads)
    split_inblock_kernel(const float* qkv, int64_t qkv_stride, const bf16* k_cache, const bf16* v_cache,
                         const int32_t* block_tables, int32_t table_width, int32_t block_size,
                         const AttentionTile* tiles, int32_t heads, int32_t kv_heads, int32_t group, float scale,
                         bf16* out) {
  __shared__ SharedTiles<HD> sh;
  const AttentionTile tile = tiles[blockIdx.x];
  if (tile.n == 0) return;  // padding
  const int g = int(blockIdx.y);
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int rows = tile.n * group;
  const int last_pos = tile.pos0 + tile.n - 1;
  load_q<HD, kRows, kThreads>(sh.q_s, qkv, qkv_stride, tile, g, group, tid);
  RowState<HD> run[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    run[i].m = -INFINITY;
    run[i].l = 0.0f;
#pragma unroll
    for (int c = 0; c < HD / 32; ++c) run[i].acc[c] = 0.0f;
  }
  for (int split = 0; split <= last_pos / kKeys; ++split) {
    __syncthreads();  // the previous split is consumed (and q_s is written)
    load_kv_tile<HD, kKeys, kThreads, SharedTiles<HD>::kPaddedK, HD>(&sh.k_s[0][0], &sh.v_s[0][0], k_cache, v_cache,
                                                                     block_tables + int64_t(tile.seq) * table_width,
                                                                     block_size, kv_heads, g, split, last_pos, tid);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int r = warp + kWarps * i;
      if (r >= rows) continue;  // warp-uniform
      const int pos = tile.pos0 + r / group;
      if (split * kKeys > pos) continue;
      const RowState<HD> st = split_partial<HD, SharedTiles<HD>::kPaddedK>(sh.q_s[r], sh.k_s, sh.v_s, sh.p_s[warp],
                                                                           split, pos, scale, lane);
      float alpha, beta;
      fold_scalars(run[i].m, run[i].l, st.m, st.l, alpha, beta);
#pragma unroll
      for (int c = 0; c < HD / 32; ++c) run[i].acc[c] = fold_dim(run[i].acc[c], st.acc[c], alpha, beta);
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + kWarps * i;
    if (r >= rows) continue;
    bf16* o = out + int64_t(tile.token0 + r / group) * heads * HD + int64_t(g * group + r % group) * HD;
#pragma unroll
    for (int c = 0; c < HD / 32; ++c) o[lane + 32 * c] = finish(run[i].acc[c], run[i].l);
  }
}

}  // namespace

int32_t attention_split_keys() { return kKeys; }

int32_t attention_split_max_splits(int32_t max_positions) { return (std::max(max_positions, 1) + kKeys - 1) / kKeys; }

int64_t attention_split_workspace_floats(int64_t query_rows, int32_t max_positions, int32_t head_dim) {
  return query_rows * attention_split_max_splits(max_positions) * (int64_t(head_dim) + 2);
}

bool attention_split_spreads(const AttentionArgs& a) {
  const int64_t rows = a.tokens * a.heads;
  return a.split_workspace != nullptr && a.max_positions > 0 &&
         attention_split_workspace_floats(rows, a.max_positions, a.head_dim) <= a.split_workspace_floats;
}

void paged_attention_split(const AttentionArgs& a, cudaStream_t s) {
  if (a.n_tiles == 0) return;
  const AttentionLaunch l = attention_launch(a, kRows, "paged_attention_split");
  if (!attention_split_spreads(a)) {
    with_head_dim(a.head_dim, "paged_attention_split", [&](auto hd) {
      split_inblock_kernel<hd><<<l.grid, kThreads, 0, s>>>(a.qkv, a.qkv_stride, a.k_cache, a.v_cache, a.block_tables,
                                                           a.table_width, a.block_size, a.tiles, a.heads, a.kv_heads,
                                                           l.group, l.scale, a.out);
    });
    TANDEM_LAUNCH_CHECK("split_inblock_kernel");
    return;
  }
  const int32_t max_splits = attention_split_max_splits(a.max_positions);
  const dim3 grid = spread_grid(a, max_splits);
  with_head_dim(a.head_dim, "paged_attention_split", [&](auto hd) {
    split_partials_kernel<hd><<<grid, kThreads, 0, s>>>(a.qkv, a.qkv_stride, a.k_cache, a.v_cache, a.block_tables,
                                                        a.table_width, a.block_size, a.tiles, a.n_tiles, max_splits,
                                                        a.heads, a.kv_heads, l.group, l.scale, a.split_workspace);
  });
  TANDEM_LAUNCH_CHECK("split_partials_kernel");
  with_head_dim(a.head_dim, "paged_attention_split", [&](auto hd) {
    split_combine_kernel<hd>
        <<<l.grid, kThreads, 0, s>>>(a.tiles, max_splits, a.heads, l.group, a.split_workspace, a.out);
  });
  TANDEM_LAUNCH_CHECK("split_combine_kernel");
}

}  // namespace tandem::cuda
