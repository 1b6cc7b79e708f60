// The backend's own GEMM, Y[T][N] = X[T][K] W[N][K]^T with bf16 operands and fp32
// accumulation on the tensor cores (WMMA 16x16x16): the fallback of deterministic mode when
// cuBLASLt offers no algorithm whose rows are invariant to T, and a reference for tests.
//
// Batch-invariant by construction: an output element is the sum of 16-wide MMA steps over K
// in ascending order, starting from zero, whatever tile it falls in and however many rows X
// has; the K tail is padded with zeros the same way for every T. Simple (64 x 64 tiles, no
// pipelining): correct first, far from cuBLAS's speed.
#include <mma.h>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"

namespace tandem::cuda {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTile = 64;  // rows of X and of W per block
constexpr int kStep = 32;  // K per shared-memory stage
constexpr int kLd = kStep + 8;
constexpr int kThreads = 128;  // 4 warps, each 32 x 32 outputs

template <class Out>
__device__ __forceinline__ Out convert(float v);
template <>
__device__ __forceinline__ float convert<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ bf16 convert<bf16>(float v) {
  return __float2bfloat16(v);
}

// rows x kStep of a row-major bf16 matrix (row stride K) from (row0, k0), zeros outside.
__device__ __forceinline__ void load_tile(bf16 (*dst)[kLd], const bf16* src, int64_t rows, int64_t K, int64_t row0,
                                          int64_t k0, int tid) {
  const bf16 zero = __float2bfloat16(0.0f);
  for (int i = tid; i < kTile * kStep; i += kThreads) {
    const int r = i / kStep, c = i % kStep;
    const int64_t gr = row0 + r, gc = k0 + c;
    dst[r][c] = gr < rows && gc < K ? src[gr * K + gc] : zero;
  }
}

template <class Out>
__global__ void __launch_bounds__(kThreads)
    gemm_invariant_kernel(const bf16* X, int64_t T, int64_t K, const bf16* W, int64_t N, Out* Y) {
  __shared__ __align__(32) bf16 x_s[kTile][kLd];
  __shared__ __align__(32) bf16 w_s[kTile][kLd];
  __shared__ __align__(32) float y_s[4][32][32 + 4];
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int64_t t0 = int64_t(blockIdx.y) * kTile, n0 = int64_t(blockIdx.x) * kTile;
  const int wr = (warp / 2) * 32, wc = (warp % 2) * 32;  // this warp's 32 x 32 inside the tile
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  for (int64_t k0 = 0; k0 < K; k0 += kStep) {
    __syncthreads();  // the previous stage is consumed
    load_tile(x_s, X, T, K, t0, k0, tid);
    load_tile(w_s, W, N, K, n0, k0, tid);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kStep; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], &x_s[wr + 16 * i][kk], kLd);
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b[j], &w_s[wc + 16 * j][kk], kLd);  // W^T, column-major
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(&y_s[warp][16 * i][16 * j], acc[i][j], 32 + 4, wmma::mem_row_major);
  __syncwarp();
  for (int e = lane; e < 32 * 32; e += 32) {
    const int r = e / 32, c = e % 32;
    const int64_t gt = t0 + wr + r, gn = n0 + wc + c;
    if (gt < T && gn < N) Y[gt * N + gn] = convert<Out>(y_s[warp][r][c]);
  }
}

template <class Out>
void launch(const bf16* X, int64_t T, int64_t K, const bf16* W, int64_t N, Out* Y, cudaStream_t s) {
  if (T == 0 || N == 0) return;
  const dim3 grid{unsigned((N + kTile - 1) / kTile), unsigned((T + kTile - 1) / kTile), 1u};
  gemm_invariant_kernel<Out><<<grid, kThreads, 0, s>>>(X, T, K, W, N, Y);
  TANDEM_LAUNCH_CHECK("gemm_invariant_kernel");
}

}  // namespace

void gemm_invariant(const bf16* X, int64_t T, int64_t K, const bf16* W, int64_t N, float* Y, cudaStream_t s) {
  launch(X, T, K, W, N, Y, s);
}

void gemm_invariant(const bf16* X, int64_t T, int64_t K, const bf16* W, int64_t N, bf16* Y, cudaStream_t s) {
  launch(X, T, K, W, N, Y, s);
}

}  // namespace tandem::cuda
