// Paged causal attention with grouped-query heads, for prefill, chunked prefill and decode
// alike: one kernel, so a token's result cannot depend on which of them served it.
//
// A thread block takes one tile (up to 16 query rows: tokens x the heads of one KV group) and
// walks the keys in tiles of 64 from position 0. Each warp owns up to 4 rows; for a row, a
// lane scores 2 keys (a fixed-order dot product over the head), the warp folds them into an
// online softmax, and each lane accumulates its output dims over the 64 keys in ascending
// order. The key tiles a row visits (floor(pos / 64) + 1 of them) and every reduction order
// depend only on the row's absolute position: batch- and chunk-invariant by construction.
#include <cmath>

#include "backend/cuda/attention_tile.cuh"
#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"

namespace tandem::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16;  // query rows per block
constexpr int kRowsPerWarp = kRows / kWarps;
constexpr int kKeys = 64;  // keys per tile: 2 per lane
constexpr unsigned kFull = 0xffffffffu;

template <int HD>
__global__ void __launch_bounds__(kThreads)
    paged_attention_kernel(const float* qkv, int64_t qkv_stride, const bf16* k_cache, const bf16* v_cache,
                           const int32_t* block_tables, int32_t table_width, int32_t block_size,
                           const AttentionTile* tiles, int32_t heads, int32_t kv_heads, int32_t group, float scale,
                           bf16* out) {
  constexpr int kPaddedK = HD + 2;  // odd word stride: lanes reading one column hit distinct banks
  constexpr int kDimsPerLane = HD / 32;
  __shared__ float q_s[kRows][HD];
  __shared__ __align__(16) bf16 k_s[kKeys][kPaddedK];
  __shared__ __align__(16) bf16 v_s[kKeys][HD];
  __shared__ float p_s[kWarps][kKeys];

  const AttentionTile tile = tiles[blockIdx.x];
  if (tile.n == 0) return;  // padding
  const int g = int(blockIdx.y);
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int rows = tile.n * group;

  load_q<HD, kRows, kThreads>(q_s, qkv, qkv_stride, tile, g, group, tid);

  const int last_pos = tile.pos0 + tile.n - 1;
  const int key_tiles = last_pos / kKeys + 1;
  const int32_t* table = block_tables + int64_t(tile.seq) * table_width;
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kDimsPerLane];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < kDimsPerLane; ++c) acc[i][c] = 0.0f;
  }

  for (int kt = 0; kt < key_tiles; ++kt) {
    __syncthreads();  // the previous tile is consumed (and q_s is written)
    load_kv_tile<HD, kKeys, kThreads, kPaddedK, HD>(&k_s[0][0], &v_s[0][0], k_cache, v_cache, table, block_size,
                                                    kv_heads, g, kt, last_pos, tid);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int r = warp + kWarps * i;
      if (r >= rows) continue;  // warp-uniform
      const int pos = tile.pos0 + r / group;
      if (kt * kKeys > pos) continue;  // this row's keys ended in an earlier tile
      float s[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = lane + 32 * half;
        const float dot = key_dot<HD>(q_s[r], &k_s[j][0]);
        s[half] = kt * kKeys + j <= pos ? dot * scale : -INFINITY;
      }
      float tile_max = fmaxf(s[0], s[1]);
#pragma unroll
      for (int o = 16; o > 0; o /= 2) tile_max = fmaxf(tile_max, __shfl_xor_sync(kFull, tile_max, o));
      const float m_new = fmaxf(m[i], tile_max);  // finite: key kt*64 <= pos is visible
      const float p0 = expf(s[0] - m_new), p1 = expf(s[1] - m_new);
      float p_sum = p0 + p1;
#pragma unroll
      for (int o = 16; o > 0; o /= 2) p_sum += __shfl_xor_sync(kFull, p_sum, o);
      p_sum = __shfl_sync(kFull, p_sum, 0);
      const float alpha = expf(m[i] - m_new);  // 0 on the first tile
      l[i] = l[i] * alpha + p_sum;
      m[i] = m_new;
      p_s[warp][lane] = p0;
      p_s[warp][lane + 32] = p1;
      __syncwarp();
#pragma unroll
      for (int c = 0; c < kDimsPerLane; ++c) {
        acc[i][c] = weighted_values<HD, kKeys>(p_s[warp], v_s, lane + 32 * c, acc[i][c] * alpha);
      }
      __syncwarp();  // p_s is rewritten by the next row
    }
  }

#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + kWarps * i;
    if (r >= rows) continue;
    bf16* o = out + int64_t(tile.token0 + r / group) * heads * HD + int64_t(g * group + r % group) * HD;
    const float inv = 1.0f / l[i];
#pragma unroll
    for (int c = 0; c < kDimsPerLane; ++c) o[lane + 32 * c] = __float2bfloat16(acc[i][c] * inv);
  }
}

}  // namespace

int32_t attention_tile_tokens(int32_t group) { return group >= kRows ? 1 : kRows / group; }

bool attention_supports_head_dim(int32_t head_dim) { return head_dim == 32 || head_dim == 64 || head_dim == 128; }

void paged_attention(const AttentionArgs& a, cudaStream_t s) {
  if (a.n_tiles == 0) return;
  const AttentionLaunch l = attention_launch(a, kRows, "paged_attention");
  with_head_dim(a.head_dim, "paged_attention", [&](auto hd) {
    paged_attention_kernel<hd><<<l.grid, kThreads, 0, s>>>(a.qkv, a.qkv_stride, a.k_cache, a.v_cache, a.block_tables,
                                                           a.table_width, a.block_size, a.tiles, a.heads, a.kv_heads,
                                                           l.group, l.scale, a.out);
  });
  TANDEM_LAUNCH_CHECK("paged_attention_kernel");
}

}  // namespace tandem::cuda
