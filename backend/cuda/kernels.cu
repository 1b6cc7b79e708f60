// Element-wise and row-wise kernels of the CUDA backend (attention is in attention.cu).
// Row kernels use one thread block of a fixed size per row, so a row's reduction order is
// the same whatever the number of rows.
#include <cfloat>
#include <climits>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"

namespace tandem::cuda {

namespace {

constexpr int kRowThreads = 256;  // fixed: it sets the reduction order of a row

unsigned blocks_for(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

__global__ void embed_gather_kernel(const int32_t* tokens, const bf16* embed, int64_t h, float* x) {
  const int64_t t = blockIdx.x;
  const bf16* src = embed + int64_t(tokens[t]) * h;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) x[t * h + i] = __bfloat162float(src[i]);
}

__global__ void add_rmsnorm_kernel(float* x, const float* residual, const float* w, int64_t h, float eps, bf16* out) {
  __shared__ float partial[kRowThreads];
  const int64_t t = blockIdx.x;
  float* row = x + t * h;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < h; i += kRowThreads) {
    float v = row[i];
    if (residual) {
      v += residual[t * h + i];
      row[i] = v;
    }
    ss = fmaf(v, v, ss);
  }
  partial[threadIdx.x] = ss;
  __syncthreads();
  for (int stride = kRowThreads / 2; stride > 0; stride /= 2) {
    if (int(threadIdx.x) < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const float inv = 1.0f / sqrtf(partial[0] / float(h) + eps);
  for (int64_t i = threadIdx.x; i < h; i += kRowThreads) out[t * h + i] = __float2bfloat16(row[i] * inv * w[i]);
}

// The rotated k and the v of one token's qkv row to its cache slot (bf16), after the whole
// block has rotated it; a negative slot (a padding row of a graph replay) writes nothing.
// (V2's tail; rope_store_kv_kernel keeps its own copy inline, as compiled for the 2026-11-30 run.)
__device__ __forceinline__ void store_kv_row(const float* row, int32_t slot, int32_t heads, int32_t kv_heads,
                                             int32_t hd, bf16* k_cache, bf16* v_cache) {
  if (slot < 0) return;
  __syncthreads();
  const int32_t n = kv_heads * hd;
  const float* k = row + int64_t(heads) * hd;
  const float* vv = k + n;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
    k_cache[int64_t(slot) * n + i] = __float2bfloat16(k[i]);
    v_cache[int64_t(slot) * n + i] = __float2bfloat16(vv[i]);
  }
}

__global__ void rope_store_kv_kernel(float* qkv, const int32_t* positions, const int32_t* slots, const float* cos_table,
                                     const float* sin_table, int32_t heads, int32_t kv_heads, int32_t hd, bf16* k_cache,
                                     bf16* v_cache) {
  const int64_t t = blockIdx.x;
  const int32_t half = hd / 2;
  const int64_t stride = int64_t(heads + 2 * kv_heads) * hd;
  float* row = qkv + t * stride;
  const float* c = cos_table + int64_t(positions[t]) * half;
  const float* s = sin_table + int64_t(positions[t]) * half;
  for (int32_t k = threadIdx.x; k < (heads + kv_heads) * half; k += blockDim.x) {
    float* v = row + int64_t(k / half) * hd;
    const int32_t i = k % half;
    const float a = v[i], b = v[i + half];
    v[i] = a * c[i] - b * s[i];
    v[i + half] = b * c[i] + a * s[i];
  }
  const int32_t slot = slots[t];
  if (slot < 0) return;  // padding row of a graph replay
  __syncthreads();
  const int32_t n = kv_heads * hd;
  const float* k = row + int64_t(heads) * hd;
  const float* vv = k + n;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
    k_cache[int64_t(slot) * n + i] = __float2bfloat16(k[i]);
    v_cache[int64_t(slot) * n + i] = __float2bfloat16(vv[i]);
  }
}

// V2 of add_rmsnorm_kernel: the same sums in the same order, a thread's kPer values loaded
// (x, then the residual) before any arithmetic. h <= kRowThreads * kPer.
template <int kPer>
__global__ void add_rmsnorm_v2_kernel(float* __restrict__ x, const float* __restrict__ residual,
                                      const float* __restrict__ w, int64_t h, float eps, bf16* __restrict__ out) {
  __shared__ float partial[kRowThreads];
  const int64_t t = blockIdx.x;
  float* row = x + t * h;
  const int tid = int(threadIdx.x);
  float v[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = tid + int64_t(k) * kRowThreads;
    v[k] = i < h ? row[i] : 0.0f;
  }
  if (residual) {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t i = tid + int64_t(k) * kRowThreads;
      if (i < h) v[k] += residual[t * h + i];
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = tid + int64_t(k) * kRowThreads;
    if (i < h) {
      if (residual) row[i] = v[k];
      ss = fmaf(v[k], v[k], ss);
    }
  }
  // V1's tree: the shared-memory steps down to a warp, then the same adds by shuffles.
  partial[tid] = ss;
  __syncthreads();
  for (int stride = kRowThreads / 2; stride >= 32; stride /= 2) {
    if (tid < stride) partial[tid] += partial[tid + stride];
    __syncthreads();
  }
  float sum = tid < 32 ? partial[tid] : 0.0f;
  if (tid < 32) {
#pragma unroll
    for (int stride = 16; stride > 0; stride /= 2) sum += __shfl_down_sync(0xffffffffu, sum, stride);
    if (tid == 0) partial[0] = sum;
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(partial[0] / float(h) + eps);
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = tid + int64_t(k) * kRowThreads;
    if (i < h) out[t * h + i] = __float2bfloat16(v[k] * inv * w[i]);
  }
}

// V2 of rope_store_kv_kernel: each thread loads its kPer rotation pairs (and their cos, sin)
// before rotating any; the same expressions as V1. (heads + kv_heads) * hd / 2 <= 256 * kPer.
template <int kPer>
__global__ void rope_store_kv_v2_kernel(float* __restrict__ qkv, const int32_t* positions, const int32_t* slots,
                                        const float* __restrict__ cos_table, const float* __restrict__ sin_table,
                                        int32_t heads, int32_t kv_heads, int32_t hd, bf16* k_cache, bf16* v_cache) {
  const int64_t t = blockIdx.x;
  const int32_t half = hd / 2;
  const int64_t stride = int64_t(heads + 2 * kv_heads) * hd;
  float* row = qkv + t * stride;
  const float* c = cos_table + int64_t(positions[t]) * half;
  const float* s = sin_table + int64_t(positions[t]) * half;
  const int32_t pairs = (heads + kv_heads) * half;
  float a[kPer], b[kPer], co[kPer], si[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int32_t k = int32_t(threadIdx.x) + j * 256;
    if (k < pairs) {
      const float* v = row + int64_t(k / half) * hd;
      const int32_t i = k % half;
      a[j] = v[i];
      b[j] = v[i + half];
      co[j] = c[i];
      si[j] = s[i];
    }
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int32_t k = int32_t(threadIdx.x) + j * 256;
    if (k < pairs) {
      float* v = row + int64_t(k / half) * hd;
      const int32_t i = k % half;
      v[i] = a[j] * co[j] - b[j] * si[j];
      v[i + half] = b[j] * co[j] + a[j] * si[j];
    }
  }
  store_kv_row(row, slots[t], heads, kv_heads, hd, k_cache, v_cache);
}

__global__ void swiglu_kernel(const float* gu, int64_t T, int64_t ffn, bf16* act) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= T * ffn) return;
  const int64_t t = idx / ffn, i = idx % ffn;
  const float g = gu[t * 2 * ffn + i], u = gu[t * 2 * ffn + ffn + i];
  act[idx] = __float2bfloat16(g / (1.0f + expf(-g)) * u);
}

__global__ void gather_rows_kernel(const bf16* in, const int32_t* rows, int64_t h, bf16* out) {
  const int64_t r = blockIdx.x;
  const bf16* src = in + int64_t(rows[r]) * h;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) out[r * h + i] = src[i];
}

constexpr int kArgmaxThreads = 1024;

__global__ void argmax_kernel(const float* logits, int64_t V, int32_t* out) {
  __shared__ float best_v[kArgmaxThreads];
  __shared__ int32_t best_i[kArgmaxThreads];
  const float* row = logits + int64_t(blockIdx.x) * V;
  float bv = -INFINITY;
  int32_t bi = INT_MAX;
  for (int64_t j = threadIdx.x; j < V; j += kArgmaxThreads) {
    const float v = row[j];
    if (v > bv || (bi == INT_MAX && v == bv)) {  // NaN never compares greater
      bv = v;
      bi = int32_t(j);
    }
  }
  best_v[threadIdx.x] = bv;
  best_i[threadIdx.x] = bi;
  __syncthreads();
  for (int stride = kArgmaxThreads / 2; stride > 0; stride /= 2) {
    if (int(threadIdx.x) < stride) {
      const float ov = best_v[threadIdx.x + stride];
      const int32_t oi = best_i[threadIdx.x + stride];
      if (ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x])) {
        best_v[threadIdx.x] = ov;
        best_i[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = best_i[0] == INT_MAX ? 0 : best_i[0];
}

__device__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void fill_uniform_kernel(bf16* w, int64_t rows, int64_t cols, int64_t full_cols, int64_t row0, int64_t col0,
                                    uint64_t key, float scale) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * cols) return;
  const int64_t full_index = (row0 + idx / cols) * full_cols + col0 + idx % cols;
  const uint64_t bits = splitmix64(key ^ splitmix64(uint64_t(full_index)));
  const float u = float(bits >> 40) * (1.0f / 16777216.0f);  // 24 bits: [0, 1)
  w[idx] = __float2bfloat16((2.0f * u - 1.0f) * scale);
}

}  // namespace

void embed_gather(const int32_t* tokens, const bf16* embed, int64_t T, int64_t h, float* x, cudaStream_t s) {
  if (T == 0) return;
  embed_gather_kernel<<<unsigned(T), 256, 0, s>>>(tokens, embed, h, x);
  TANDEM_LAUNCH_CHECK("embed_gather_kernel");
}

void add_rmsnorm(float* x, const float* residual, const float* w, int64_t T, int64_t h, float eps, bf16* out,
                 cudaStream_t s, RowKernels version) {
  if (T == 0) return;
  if (version == RowKernels::V2 && h <= 8 * kRowThreads) {
    add_rmsnorm_v2_kernel<8><<<unsigned(T), kRowThreads, 0, s>>>(x, residual, w, h, eps, out);
    TANDEM_LAUNCH_CHECK("add_rmsnorm_v2_kernel");
    return;
  }
  if (version == RowKernels::V2 && h <= 32 * kRowThreads) {
    add_rmsnorm_v2_kernel<32><<<unsigned(T), kRowThreads, 0, s>>>(x, residual, w, h, eps, out);
    TANDEM_LAUNCH_CHECK("add_rmsnorm_v2_kernel");
    return;
  }
  add_rmsnorm_kernel<<<unsigned(T), kRowThreads, 0, s>>>(x, residual, w, h, eps, out);
  TANDEM_LAUNCH_CHECK("add_rmsnorm_kernel");
}

void rope_store_kv(float* qkv, const int32_t* positions, const int32_t* slots, const float* cos, const float* sin,
                   int64_t T, int32_t heads, int32_t kv_heads, int32_t head_dim, bf16* k_cache, bf16* v_cache,
                   cudaStream_t s, RowKernels version) {
  if (T == 0) return;
  if (version == RowKernels::V2 && (heads + kv_heads) * (head_dim / 2) <= 16 * 256) {
    rope_store_kv_v2_kernel<16>
        <<<unsigned(T), 256, 0, s>>>(qkv, positions, slots, cos, sin, heads, kv_heads, head_dim, k_cache, v_cache);
    TANDEM_LAUNCH_CHECK("rope_store_kv_v2_kernel");
    return;
  }
  rope_store_kv_kernel<<<unsigned(T), 256, 0, s>>>(qkv, positions, slots, cos, sin, heads, kv_heads, head_dim, k_cache,
                                                   v_cache);
  TANDEM_LAUNCH_CHECK("rope_store_kv_kernel");
}

void swiglu(const float* gu, int64_t T, int64_t ffn, bf16* act, cudaStream_t s) {
  if (T * ffn == 0) return;
  swiglu_kernel<<<blocks_for(T * ffn, 256), 256, 0, s>>>(gu, T, ffn, act);
  TANDEM_LAUNCH_CHECK("swiglu_kernel");
}

void gather_rows(const bf16* in, const int32_t* rows, int64_t n, int64_t h, bf16* out, cudaStream_t s) {
  if (n == 0) return;
  gather_rows_kernel<<<unsigned(n), 256, 0, s>>>(in, rows, h, out);
  TANDEM_LAUNCH_CHECK("gather_rows_kernel");
}

void argmax_rows(const float* logits, int64_t n, int64_t V, int32_t* out, cudaStream_t s) {
  if (n == 0) return;
  argmax_kernel<<<unsigned(n), kArgmaxThreads, 0, s>>>(logits, V, out);
  TANDEM_LAUNCH_CHECK("argmax_kernel");
}

void fill_uniform(bf16* w, int64_t rows, int64_t cols, int64_t full_cols, int64_t row0, int64_t col0, uint64_t seed,
                  uint64_t tensor_id, float scale, cudaStream_t s) {
  if (rows * cols == 0) return;
  const uint64_t key = seed * 0x9e3779b97f4a7c15ull ^ (tensor_id + 1) * 0xd1b54a32d192ed03ull;
  fill_uniform_kernel<<<blocks_for(rows * cols, 256), 256, 0, s>>>(w, rows, cols, full_cols, row0, col0, key, scale);
  TANDEM_LAUNCH_CHECK("fill_uniform_kernel");
}

}  // namespace tandem::cuda
