// The tensor-core split-KV kernel's tile (attention_mma_split.cu): the shared-memory layout of
// a block (64 query rows, 16 per warp; a 64-key tile) and a warp's two products on one key
// tile, S = Q K^T and O_tile = P V, by WMMA 16x16x16 steps in ascending order (bf16 operands,
// fp32 accumulation from zero). The same layout and products as attention_mma.cu, which keeps
// its own inline copy: moved here, its PTX changed (integer address arithmetic only), and it
// is the kernel measured on the H200 on 2026-11-30 (tools/ptx-check).
#pragma once
#include <cuda_bf16.h>
#include <mma.h>

#include <cstddef>

namespace tandem::cuda::mma_tile {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;
constexpr int kRows = 64;  // 16 per warp
constexpr int kKeys = 64;

template <int HD>
struct MmaLayout {
  static constexpr int kLd = HD + 8;                          // bf16 rows of Q, K, V (keeps 32-byte alignment)
  static constexpr int kLdP = kKeys + 8;                      // bf16 rows of P
  static constexpr int kLdS = (HD > kKeys ? HD : kKeys) + 4;  // fp32 scratch rows: S, then O_tile
  static constexpr size_t kQ = size_t(kRows) * kLd * 2, kK = size_t(kKeys) * kLd * 2, kV = kK;
  static constexpr size_t kP = size_t(kWarps) * 16 * kLdP * 2, kS = size_t(kWarps) * 16 * kLdS * 4;
  static constexpr size_t kBytes = kQ + kK + kV + kP + kS;
};

// S[16][64] (fp32, row stride L::kLdS, at s_w) = warp `warp`'s 16 query rows of q_s (bf16)
// times the tile's 64 keys (k_s), over the head in ascending 16-wide steps.
template <int HD>
__device__ __forceinline__ void mma_scores(const bf16* q_s, int warp, const bf16* k_s, float* s_w) {
  using L = MmaLayout<HD>;
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
}

// O_tile[16][HD] (fp32, at s_w) = this warp's P[16][64] (p_w, bf16) times the tile's values
// (v_s), over the keys in ascending 16-wide steps.
template <int HD>
__device__ __forceinline__ void mma_pv(const bf16* p_w, const bf16* v_s, float* s_w) {
  using L = MmaLayout<HD>;
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
}

}  // namespace tandem::cuda::mma_tile
