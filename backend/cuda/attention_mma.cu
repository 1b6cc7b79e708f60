// Paged causal attention on the tensor cores (WMMA, bf16 operands, fp32 accumulation): the
// variant for long prefills, where attention's FLOPs grow with the square of the prompt.
// Same contract and same tiles of 64 keys from position 0 as the SIMT kernel (attention.cu),
// but it is a different function: a run uses one variant throughout (engine.cuda_attention).
//
// A block takes up to 64 query rows (tokens x the heads of one KV group) of one sequence;
// each of its 4 warps owns 16 rows. Per key tile: S = Q K^T by 16x16x16 MMAs over the head
// dim in ascending order; each row's online softmax in fixed order (a lane pair per row, 32
// keys each); O_tile = P V by MMAs over the 64 keys in ascending order; O = O * alpha + O_tile.
// An MMA output element depends only on its own row and column, and a row only updates its
// state on the tiles its position reaches, so a token's result does not depend on the other
// rows of its block: batch- and chunk-invariant.
#include <mma.h>

#include <cmath>

#include "backend/cuda/attention_tile.cuh"
#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"

namespace tandem::cuda {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 64;  // 16 per warp
constexpr int kKeys = 64;
constexpr unsigned kFull = 0xffffffffu;

template <int HD>
struct MmaLayout {
  static constexpr int kLd = HD + 8;                          // bf16 rows of Q, K, V (keeps 32-byte alignment)
  static constexpr int kLdP = kKeys + 8;                      // bf16 rows of P
  static constexpr int kLdS = (HD > kKeys ? HD : kKeys) + 4;  // fp32 scratch rows: S, then O_tile
  static constexpr size_t kQ = size_t(kRows) * kLd * 2, kK = size_t(kKeys) * kLd * 2, kV = kK;
  static constexpr size_t kP = size_t(kWarps) * 16 * kLdP * 2, kS = size_t(kWarps) * 16 * kLdS * 4;
  static constexpr size_t kBytes = kQ + kK + kV + kP + kS;
};

template <int HD>
__global__ void __launch_bounds__(kThreads)
    paged_attention_mma_kernel(const float* qkv, int64_t qkv_stride, const bf16* k_cache, const bf16* v_cache,
                               const int32_t* block_tables, int32_t table_width, int32_t block_size,
                               const AttentionTile* tiles, int32_t heads, int32_t kv_heads, int32_t group, float scale,
                               bf16* out) {
  using L = MmaLayout<HD>;
  constexpr int kHalfDims = HD / 2;  // output dims per lane (a lane pair per row)
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* k_s = reinterpret_cast<bf16*>(smem + L::kQ);
  bf16* v_s = reinterpret_cast<bf16*>(smem + L::kQ + L::kK);
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  bf16* p_w = reinterpret_cast<bf16*>(smem + L::kQ + L::kK + L::kV) + size_t(warp) * 16 * L::kLdP;
  float* s_w = reinterpret_cast<float*>(smem + L::kQ + L::kK + L::kV + L::kP) + size_t(warp) * 16 * L::kLdS;

  const AttentionTile tile = tiles[blockIdx.x];
  if (tile.n == 0) return;  // padding
  const int g = int(blockIdx.y);
  const int rows = tile.n * group;

  for (int i = tid; i < kRows * HD; i += kThreads) {
    const int r = i / HD, d = i % HD;
    float v = 0.0f;
    if (r < rows) v = qkv[int64_t(tile.token0 + r / group) * qkv_stride + int64_t(g * group + r % group) * HD + d];
    q_s[r * L::kLd + d] = __float2bfloat16(v);
  }

  // This lane's row (a pair of lanes per row) and its state.
  const int row_in_warp = lane / 2, half = lane % 2;
  const int row = warp * 16 + row_in_warp;
  const bool valid = row < rows;
  const int pos = tile.pos0 + row / group;
  const int warp_rows = rows - warp * 16;  // valid rows of this warp (may be <= 0)
  const int warp_last_pos =
      warp_rows > 0 ? tile.pos0 + (warp * 16 + (warp_rows < 16 ? warp_rows : 16) - 1) / group : -1;
  float m = -INFINITY, l = 0.0f, o[kHalfDims];
#pragma unroll
  for (int i = 0; i < kHalfDims; ++i) o[i] = 0.0f;

  const int last_pos = tile.pos0 + tile.n - 1;
  const int key_tiles = last_pos / kKeys + 1;
  const int32_t* table = block_tables + int64_t(tile.seq) * table_width;
  for (int kt = 0; kt < key_tiles; ++kt) {
    __syncthreads();  // the previous tile is consumed (and q_s is written)
    load_kv_tile<HD, kKeys, kThreads, L::kLd, L::kLd>(k_s, v_s, k_cache, v_cache, table, block_size, kv_heads, g, kt,
                                                      last_pos, tid);
    __syncthreads();
    if (kt * kKeys > warp_last_pos) continue;  // warp-uniform: every row of this warp ended earlier

      // S = Q K^T for this warp's 16 rows and the 64 keys.
#pragma unroll
    for (int n = 0; n < kKeys / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int d0 = 0; d0 < HD; d0 += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
        wmma::load_matrix_sync(a, q_s + (warp * 16) * L::kLd + d0, L::kLd);
        wmma::load_matrix_sync(b, k_s + (n * 16) * L::kLd + d0, L::kLd);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(s_w + n * 16, acc, L::kLdS, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax, one lane pair per row; a row whose keys ended earlier keeps its state.
    const bool active = valid && kt * kKeys <= pos;
    float s[32], mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int key = kt * kKeys + half * 32 + j;
      s[j] = key <= pos ? s_w[row_in_warp * L::kLdS + half * 32 + j] * scale : -INFINITY;
      mx = fmaxf(mx, s[j]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
    const float m_new = active ? fmaxf(m, mx) : 0.0f;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const float p = active ? expf(s[j] - m_new) : 0.0f;
      sum += p;
      p_w[row_in_warp * L::kLdP + half * 32 + j] = __float2bfloat16(p);
    }
    sum += __shfl_xor_sync(kFull, sum, 1);  // a + b on one lane, b + a on the other: the same
    float alpha = 1.0f;
    if (active) {
      alpha = expf(m - m_new);  // 0 on the row's first tile
      l = l * alpha + sum;
      m = m_new;
    }
    __syncwarp();

    // O_tile = P V, into the scratch (S is consumed).
#pragma unroll
    for (int n = 0; n < HD / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int k0 = 0; k0 < kKeys; k0 += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b;
        wmma::load_matrix_sync(a, p_w + k0, L::kLdP);
        wmma::load_matrix_sync(b, v_s + k0 * L::kLd + n * 16, L::kLd);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(s_w + n * 16, acc, L::kLdS, wmma::mem_row_major);
    }
    __syncwarp();
    if (active) {
#pragma unroll
      for (int i = 0; i < kHalfDims; ++i) o[i] = o[i] * alpha + s_w[row_in_warp * L::kLdS + half * kHalfDims + i];
    }
    __syncwarp();  // the scratch is rewritten by the next tile
  }

  if (!valid) return;
  bf16* dst =
      out + int64_t(tile.token0 + row / group) * heads * HD + int64_t(g * group + row % group) * HD + half * kHalfDims;
  const float inv = 1.0f / l;
#pragma unroll
  for (int i = 0; i < kHalfDims; ++i) dst[i] = __float2bfloat16(o[i] * inv);
}

template <int HD>
void launch_mma(const AttentionArgs& a, const AttentionLaunch& l, cudaStream_t s) {
  constexpr size_t bytes = MmaLayout<HD>::kBytes;
  // The opt-in to more than 48 KB of shared memory is per function and device: once each.
  static bool configured[64] = {};
  int device = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= 64 || !configured[device]) {
    TANDEM_CUDA_CHECK(
        cudaFuncSetAttribute(paged_attention_mma_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    if (device < 64) configured[device] = true;
  }
  paged_attention_mma_kernel<HD><<<l.grid, kThreads, bytes, s>>>(a.qkv, a.qkv_stride, a.k_cache, a.v_cache,
                                                                 a.block_tables, a.table_width, a.block_size, a.tiles,
                                                                 a.heads, a.kv_heads, l.group, l.scale, a.out);
}

}  // namespace

int32_t attention_mma_tile_tokens(int32_t group) { return group >= kRows ? 1 : kRows / group; }

void paged_attention_mma(const AttentionArgs& a, cudaStream_t s) {
  if (a.n_tiles == 0) return;
  const AttentionLaunch l = attention_launch(a, kRows, "paged_attention_mma");
  with_head_dim(a.head_dim, "paged_attention_mma", [&](auto hd) { launch_mma<hd>(a, l, s); });
  TANDEM_LAUNCH_CHECK("paged_attention_mma_kernel");
}

}  // namespace tandem::cuda
