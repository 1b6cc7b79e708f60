// The backend's own GEMM, Y[T][N] = X[T][K] W[N][K]^T with bf16 operands and fp32
// accumulation on the tensor cores (WMMA 16x16x16): the fallback of deterministic mode when
// cuBLASLt offers no algorithm whose rows are invariant to T, and a reference for tests.
//
// Batch-invariant by construction: an output element is the sum of 16-wide MMA steps over K
// in ascending order, starting from zero, whatever tile it falls in and however many rows X
// has; the K tail is padded with zeros to a multiple of 32 the same way for every T. Simple
// (64 x 64 tiles, no pipelining): correct first, far from cuBLAS's speed.
//
// Steps of up to 64 rows (decode) take a skinny kernel instead: the 64 x 64 tiles leave most
// of the GPU idle when N / 64 blocks each stream their weights through one shared-memory stage
// at a time. It computes the same function: the same WMMA 16x16x16 steps over K in ascending
// order from zero, the same zero step where K % 32 == 16. Rows of X (at most 64, zero-padded)
// sit in shared memory a K chunk at a time; each warp streams its 16 weight rows straight from
// global memory. The cuda suite compares its bits with the tiled kernel's.
#include <mma.h>

#include <cstdint>

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

// The skinny kernel: MT fragments of 16 rows (T <= 16 * MT), a warp per 16 output columns.
constexpr int kSkinnyWarps = 2;
constexpr int kSkinnyChunk = 256;             // K per shared-memory stage of X (a multiple of kStep)
constexpr int kSkinnyLd = kSkinnyChunk + 16;  // bf16 row stride: rows stay 32-byte aligned
constexpr int kSkinnyThreads = 32 * kSkinnyWarps;
constexpr int kPrefetch = 16;  // weight fragments a warp loads before using them (kSkinnyChunk / 16 at most)

template <int MT, class Out>
__global__ void __launch_bounds__(kSkinnyThreads)
    gemm_skinny_kernel(const bf16* X, int64_t T, int64_t K, const bf16* W, int64_t N, Out* Y) {
  __shared__ __align__(32) bf16 x_s[16 * MT][kSkinnyLd];
  __shared__ __align__(32) float y_s[kSkinnyWarps][16][16 + 4];
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int64_t n0 = (int64_t(blockIdx.x) * kSkinnyWarps + warp) * 16;
  const bool active = n0 < N;                                // warp-uniform; every warp still helps load X
  const int64_t k_padded = (K + kStep - 1) / kStep * kStep;  // as the tiled kernel: its last stage may be half zeros
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[MT];
#pragma unroll
  for (int i = 0; i < MT; ++i) wmma::fill_fragment(acc[i], 0.0f);
  const bf16 zero = __float2bfloat16(0.0f);
  for (int64_t k0 = 0; k0 < k_padded; k0 += kSkinnyChunk) {
    const int width = int(min(int64_t(kSkinnyChunk), k_padded - k0));
    __syncthreads();  // the previous chunk is consumed
    for (int i = tid; i < 16 * MT * width; i += kSkinnyThreads) {
      const int r = i / width, c = i % width;
      const int64_t gc = k0 + c;
      x_s[r][c] = r < T && gc < K ? X[int64_t(r) * K + gc] : zero;
    }
    __syncthreads();
    if (!active) continue;
    // Weight fragments kPrefetch steps at a time, all loads issued before their MMAs: a warp
    // has kPrefetch * 512 bytes in flight (one at a time would leave the loads latency-bound).
    for (int kk0 = 0; kk0 < width; kk0 += 16 * kPrefetch) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b[kPrefetch];
#pragma unroll
      for (int u = 0; u < kPrefetch; ++u) {
        const int kk = kk0 + 16 * u;
        if (kk < width && k0 + kk < K)
          wmma::load_matrix_sync(b[u], W + n0 * K + k0 + kk, unsigned(K));  // W^T, column-major: W's rows as they are
        else
          wmma::fill_fragment(b[u], zero);  // the tiled kernel's zero padding (unused past width)
      }
#pragma unroll
      for (int u = 0; u < kPrefetch; ++u) {
        const int kk = kk0 + 16 * u;
        if (kk >= width) break;  // warp-uniform
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
          wmma::load_matrix_sync(a, &x_s[16 * i][kk], kSkinnyLd);
          wmma::mma_sync(acc[i], a, b[u], acc[i]);
        }
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    wmma::store_matrix_sync(&y_s[warp][0][0], acc[i], 16 + 4, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 16 * 16; e += 32) {
      const int r = e / 16, c = e % 16;
      const int64_t gt = 16 * i + r;
      if (gt < T) Y[gt * N + n0 + c] = convert<Out>(y_s[warp][r][c]);
    }
    __syncwarp();
  }
}

// Whether the skinny kernel takes this GEMM: at most 64 rows, whole 16 x 16 fragments of W
// (N and K multiples of 16) and 32-byte aligned operands, as WMMA loads from global memory need.
bool skinny_fits(const bf16* X, int64_t T, int64_t K, const bf16* W, int64_t N) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 32 == 0; };
  return T >= 1 && T <= 64 && N % 16 == 0 && K % 16 == 0 && aligned(X) && aligned(W);
}

template <class Out>
void launch_skinny(const bf16* X, int64_t T, int64_t K, const bf16* W, int64_t N, Out* Y, cudaStream_t s) {
  const unsigned blocks = unsigned((N / 16 + kSkinnyWarps - 1) / kSkinnyWarps);
  if (T <= 16)
    gemm_skinny_kernel<1, Out><<<blocks, kSkinnyThreads, 0, s>>>(X, T, K, W, N, Y);
  else if (T <= 32)
    gemm_skinny_kernel<2, Out><<<blocks, kSkinnyThreads, 0, s>>>(X, T, K, W, N, Y);
  else
    gemm_skinny_kernel<4, Out><<<blocks, kSkinnyThreads, 0, s>>>(X, T, K, W, N, Y);
  TANDEM_LAUNCH_CHECK("gemm_skinny_kernel");
}

template <class Out>
void launch(const bf16* X, int64_t T, int64_t K, const bf16* W, int64_t N, Out* Y, cudaStream_t s, bool skinny) {
  if (T == 0 || N == 0) return;
  if (skinny && skinny_fits(X, T, K, W, N)) return launch_skinny(X, T, K, W, N, Y, s);
  const dim3 grid{unsigned((N + kTile - 1) / kTile), unsigned((T + kTile - 1) / kTile), 1u};
  gemm_invariant_kernel<Out><<<grid, kThreads, 0, s>>>(X, T, K, W, N, Y);
  TANDEM_LAUNCH_CHECK("gemm_invariant_kernel");
}

}  // namespace

void gemm_invariant(const bf16* X, int64_t T, int64_t K, const bf16* W, int64_t N, float* Y, cudaStream_t s,
                    bool skinny) {
  launch(X, T, K, W, N, Y, s, skinny);
}

void gemm_invariant(const bf16* X, int64_t T, int64_t K, const bf16* W, int64_t N, bf16* Y, cudaStream_t s,
                    bool skinny) {
  launch(X, T, K, W, N, Y, s, skinny);
}

bool gemm_invariant_is_skinny(const bf16* X, int64_t T, int64_t K, const bf16* W, int64_t N) {
  return skinny_fits(X, T, K, W, N);
}

}  // namespace tandem::cuda
