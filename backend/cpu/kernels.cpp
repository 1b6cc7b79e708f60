#include "backend/cpu/kernels.h"

#include "core/error.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <stdexcept>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define TANDEM_AVX2 1
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

namespace tandem::cpu {

namespace {
int g_threads = 0;

#ifdef TANDEM_AVX2
using Acc = __m256;
inline Acc acc_zero() { return _mm256_setzero_ps(); }
inline Acc fma8(const float* a, const float* b, Acc c) {
  return _mm256_fmadd_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(b), c);
}
inline void store8(Acc v, float* out) { _mm256_storeu_ps(out, v); }
#else
struct Acc {
  float v[8];
};
inline Acc acc_zero() { return Acc{}; }
inline Acc fma8(const float* a, const float* b, Acc c) {
  for (int l = 0; l < 8; ++l) c.v[l] = std::fma(a[l], b[l], c.v[l]);
  return c;
}
inline void store8(Acc v, float* out) {
  for (int l = 0; l < 8; ++l) out[l] = v.v[l];
}
#endif

// The tail (k not a multiple of 8) goes into lanes 0..r-1 with scalar FMAs, which is what
// a masked vector FMA would compute; then the fixed tree.
inline float finish(Acc acc, const float* a, const float* b, int64_t k0, int64_t K) {
  alignas(32) float l[8];
  store8(acc, l);
  for (int64_t k = k0; k < K; ++k) l[k - k0] = std::fma(a[k], b[k], l[k - k0]);
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}
}  // namespace

void set_threads(int n) {
  if (n < 0 || n > 1024) throw InputError("--threads must be in [0, 1024] (0: all cores)");
  g_threads = n;
}
int threads() {
#ifdef _OPENMP
  return g_threads > 0 ? g_threads : omp_get_max_threads();
#else
  return 1;
#endif
}

float dot(const float* a, const float* b, int64_t n) {
  Acc acc = acc_zero();
  const int64_t k8 = n / 8 * 8;
  for (int64_t k = 0; k < k8; k += 8) acc = fma8(a + k, b + k, acc);
  return finish(acc, a, b, k8, n);
}

void rms_norm(const float* x, const float* w, int64_t n, float eps, float* y) {
  const float ss = dot(x, x, n);
  const float scale = 1.0f / std::sqrt(ss / float(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

namespace {
// One tile column of gemm_nt: outputs n0..n0+3 (or the ragged rest) for every row.
// Strides: X rows ldx apart, W rows ldw apart, Y rows ldy apart.
void gemm_tile(const float* X, int64_t ldx, int64_t T, int64_t K, const float* W, int64_t ldw, int64_t N, float* Y,
               int64_t ldy, int64_t tile);
// The same tile with K in `segments` equal runs: each run's fixed-order dot, then tree_sum.
void gemm_tile_segmented(const float* X, int64_t ldx, int64_t T, int64_t K, const float* W, int64_t ldw, int64_t N,
                         float* Y, int64_t ldy, int64_t tile, int32_t segments);
}  // namespace

float tree_sum(float* v, int64_t n) {
  if (n <= 0) return 0.0f;
  // Level by level, neighbours pairwise; an odd last one moves up alone. For n a power of two
  // this is the balanced tree whose subtrees are aligned runs of 2^j leaves, which is what makes
  // a rank's share of the leaves (tensor parallelism) a subtree.
  while (n > 1) {
    const int64_t half = n / 2;
    for (int64_t i = 0; i < half; ++i) v[i] = v[2 * i] + v[2 * i + 1];
    if (n % 2) v[half] = v[n - 1];
    n = half + n % 2;
  }
  return v[0];
}

float segmented_dot(const float* a, const float* b, int64_t n, int32_t segments) {
  if (segments <= 1) return dot(a, b, n);
  float v[kMaxReductionSegments];
  const int64_t len = n / segments;
  for (int32_t s = 0; s < segments; ++s) v[s] = dot(a + s * len, b + s * len, len);
  return tree_sum(v, segments);
}

void gemm_nt(const float* X, int64_t T, int64_t K, const float* W, int64_t N, float* Y) {
  gemm_nt_segmented(X, T, K, W, N, Y, 1);
}

void gemm_nt_segmented(const float* X, int64_t T, int64_t K, const float* W, int64_t N, float* Y, int32_t segments) {
  if (segments < 1 || segments > kMaxReductionSegments || K % segments != 0)
    throw std::invalid_argument("gemm_nt_segmented: segments must be in [1, 8] and divide K");
  const int64_t n_tiles = (N + 3) / 4;
  // Rows of X in blocks that stay in L2 (about 1 MB) while every W tile passes over them;
  // tiles of 4 outputs x 2 rows share loads. Every element still sees exactly the fma8
  // sequence of dot() over its own row and column. Threads split the outputs.
  const int64_t rows = std::clamp<int64_t>((int64_t(1) << 20) / (4 * std::max<int64_t>(K, 1)) / 2 * 2, 2, 256);
#pragma omp parallel num_threads(threads()) if (T * N * K > (1 << 18))
  for (int64_t t0 = 0; t0 < T; t0 += rows) {
    const int64_t tb = std::min(rows, T - t0);
#pragma omp for schedule(static)
    for (int64_t tile = 0; tile < n_tiles; ++tile) {
      if (segments == 1)
        gemm_tile(X + t0 * K, K, tb, K, W, K, N, Y + t0 * N, N, tile);
      else
        gemm_tile_segmented(X + t0 * K, K, tb, K, W, K, N, Y + t0 * N, N, tile, segments);
    }
  }
}

void gemm_nt_serial(const float* X, int64_t ldx, int64_t T, int64_t K, const float* W, int64_t ldw, int64_t N, float* Y,
                    int64_t ldy) {
  for (int64_t tile = 0; tile < (N + 3) / 4; ++tile) gemm_tile(X, ldx, T, K, W, ldw, N, Y, ldy, tile);
}

namespace {
void gemm_tile(const float* X, int64_t ldx, int64_t T, int64_t K, const float* W, int64_t ldw, int64_t N, float* Y,
               int64_t ldy, int64_t tile) {
  const int64_t k8 = K / 8 * 8;
  {
    const int64_t n0 = tile * 4;
    if (n0 + 4 > N) {  // ragged edge: plain fixed-order dots
      for (int64_t n = n0; n < N; ++n)
        for (int64_t t = 0; t < T; ++t) Y[t * ldy + n] = dot(X + t * ldx, W + n * ldw, K);
      return;
    }
    const float* w0 = W + n0 * ldw;
    const float *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
    int64_t t = 0;
    for (; t + 2 <= T; t += 2) {
      const float* x0 = X + t * ldx;
      const float* x1 = x0 + ldx;
      Acc a00 = acc_zero(), a01 = acc_zero(), a02 = acc_zero(), a03 = acc_zero();
      Acc a10 = acc_zero(), a11 = acc_zero(), a12 = acc_zero(), a13 = acc_zero();
      for (int64_t k = 0; k < k8; k += 8) {
        a00 = fma8(x0 + k, w0 + k, a00);
        a01 = fma8(x0 + k, w1 + k, a01);
        a02 = fma8(x0 + k, w2 + k, a02);
        a03 = fma8(x0 + k, w3 + k, a03);
        a10 = fma8(x1 + k, w0 + k, a10);
        a11 = fma8(x1 + k, w1 + k, a11);
        a12 = fma8(x1 + k, w2 + k, a12);
        a13 = fma8(x1 + k, w3 + k, a13);
      }
      float* y0 = Y + t * ldy + n0;
      float* y1 = y0 + ldy;
      y0[0] = finish(a00, x0, w0, k8, K);
      y0[1] = finish(a01, x0, w1, k8, K);
      y0[2] = finish(a02, x0, w2, k8, K);
      y0[3] = finish(a03, x0, w3, k8, K);
      y1[0] = finish(a10, x1, w0, k8, K);
      y1[1] = finish(a11, x1, w1, k8, K);
      y1[2] = finish(a12, x1, w2, k8, K);
      y1[3] = finish(a13, x1, w3, k8, K);
    }
    for (; t < T; ++t) {
      const float* x0 = X + t * ldx;
      Acc a0 = acc_zero(), a1 = acc_zero(), a2 = acc_zero(), a3 = acc_zero();
      for (int64_t k = 0; k < k8; k += 8) {
        a0 = fma8(x0 + k, w0 + k, a0);
        a1 = fma8(x0 + k, w1 + k, a1);
        a2 = fma8(x0 + k, w2 + k, a2);
        a3 = fma8(x0 + k, w3 + k, a3);
      }
      float* y0 = Y + t * ldy + n0;
      y0[0] = finish(a0, x0, w0, k8, K);
      y0[1] = finish(a1, x0, w1, k8, K);
      y0[2] = finish(a2, x0, w2, k8, K);
      y0[3] = finish(a3, x0, w3, k8, K);
    }
  }
}

void gemm_tile_segmented(const float* X, int64_t ldx, int64_t T, int64_t K, const float* W, int64_t ldw, int64_t N,
                         float* Y, int64_t ldy, int64_t tile, int32_t segments) {
  const int64_t len = K / segments, len8 = len / 8 * 8;
  const int64_t n0 = tile * 4;
  if (n0 + 4 > N) {  // ragged edge: plain segmented dots
    for (int64_t n = n0; n < N; ++n)
      for (int64_t t = 0; t < T; ++t) Y[t * ldy + n] = segmented_dot(X + t * ldx, W + n * ldw, K, segments);
    return;
  }
  // v[j][s]: output j of the tile (row-major 2 x 4), segment s.
  float v[8][kMaxReductionSegments];
  int64_t t = 0;
  for (; t + 2 <= T; t += 2) {
    for (int32_t s = 0; s < segments; ++s) {
      const int64_t k0 = s * len;
      const float* x0 = X + t * ldx + k0;
      const float* x1 = x0 + ldx;
      const float* w0 = W + n0 * ldw + k0;
      const float *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
      Acc a00 = acc_zero(), a01 = acc_zero(), a02 = acc_zero(), a03 = acc_zero();
      Acc a10 = acc_zero(), a11 = acc_zero(), a12 = acc_zero(), a13 = acc_zero();
      for (int64_t k = 0; k < len8; k += 8) {
        a00 = fma8(x0 + k, w0 + k, a00);
        a01 = fma8(x0 + k, w1 + k, a01);
        a02 = fma8(x0 + k, w2 + k, a02);
        a03 = fma8(x0 + k, w3 + k, a03);
        a10 = fma8(x1 + k, w0 + k, a10);
        a11 = fma8(x1 + k, w1 + k, a11);
        a12 = fma8(x1 + k, w2 + k, a12);
        a13 = fma8(x1 + k, w3 + k, a13);
      }
      v[0][s] = finish(a00, x0, w0, len8, len);
      v[1][s] = finish(a01, x0, w1, len8, len);
      v[2][s] = finish(a02, x0, w2, len8, len);
      v[3][s] = finish(a03, x0, w3, len8, len);
      v[4][s] = finish(a10, x1, w0, len8, len);
      v[5][s] = finish(a11, x1, w1, len8, len);
      v[6][s] = finish(a12, x1, w2, len8, len);
      v[7][s] = finish(a13, x1, w3, len8, len);
    }
    for (int64_t r = 0; r < 2; ++r)
      for (int j = 0; j < 4; ++j) Y[(t + r) * ldy + n0 + j] = tree_sum(v[r * 4 + j], segments);
  }
  for (; t < T; ++t) {  // the last row of an odd count (and decode's single row)
    for (int32_t s = 0; s < segments; ++s) {
      const int64_t k0 = s * len;
      const float* x0 = X + t * ldx + k0;
      const float* w0 = W + n0 * ldw + k0;
      const float *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
      Acc a0 = acc_zero(), a1 = acc_zero(), a2 = acc_zero(), a3 = acc_zero();
      for (int64_t k = 0; k < len8; k += 8) {
        a0 = fma8(x0 + k, w0 + k, a0);
        a1 = fma8(x0 + k, w1 + k, a1);
        a2 = fma8(x0 + k, w2 + k, a2);
        a3 = fma8(x0 + k, w3 + k, a3);
      }
      v[0][s] = finish(a0, x0, w0, len8, len);
      v[1][s] = finish(a1, x0, w1, len8, len);
      v[2][s] = finish(a2, x0, w2, len8, len);
      v[3][s] = finish(a3, x0, w3, len8, len);
    }
    for (int j = 0; j < 4; ++j) Y[t * ldy + n0 + j] = tree_sum(v[j], segments);
  }
}
}  // namespace

void weighted_rows_sum(const float* p, int64_t n, const float* const* rows, int64_t D, float* out) {
  int64_t d0 = 0;
#ifdef TANDEM_AVX2
  for (; d0 + 8 <= D; d0 += 8) {
    __m256 a[8];
    for (auto& x : a) x = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; ++j)
      a[j % 8] = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(rows[j] + d0), a[j % 8]);
    const __m256 t = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
                                   _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])));
    _mm256_storeu_ps(out + d0, t);
  }
#endif
  for (int64_t d = d0; d < D; ++d) {
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = 0; j < n; ++j) l[j % 8] = std::fma(p[j], rows[j][d], l[j % 8]);
    out[d] = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
  }
}

float lane_sum(const float* x, int64_t n) {
  float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < n; ++i) l[i % 8] += x[i];
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

namespace {
// Cephes expf, lane by lane: the same operations in the same order for every lane.
#ifdef TANDEM_AVX2
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3365f)), _mm256_set1_ps(88.3762626647950f));
  __m256 fx =
      _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _mm256_set1_ps(0.5f)));
  x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(0.693359375f)));
  x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(-2.12194440e-4f)));
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  for (float c : {1.3981999507E-3f, 8.3334519073E-3f, 4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f})
    y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(c));
  y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(y, _mm256_mul_ps(x, x)), x), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
void exp_block(float* v) { _mm256_storeu_ps(v, exp8(_mm256_loadu_ps(v))); }
#else
void exp_block(float* v) {
  for (int l = 0; l < 8; ++l) {
    float x = std::min(std::max(v[l], -87.3365f), 88.3762626647950f);
    const float fx = std::floor(x * 1.44269504088896341f + 0.5f);
    x = x - fx * 0.693359375f;
    x = x - fx * -2.12194440e-4f;
    float y = 1.9875691500E-4f;
    for (float c : {1.3981999507E-3f, 8.3334519073E-3f, 4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f})
      y = y * x + c;
    y = y * (x * x) + x + 1.0f;
    v[l] = std::ldexp(y, int(fx));
  }
}
#endif
}  // namespace

void exp_inplace(float* x, int64_t n) {
  const int64_t n8 = n / 8 * 8;
  for (int64_t i = 0; i < n8; i += 8) exp_block(x + i);
  if (n8 < n) {
    float pad[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::copy(x + n8, x + n, pad);
    exp_block(pad);
    std::copy(pad, pad + (n - n8), x + n8);
  }
}

void gemm_nt_eigen(const float* X, int64_t T, int64_t K, const float* W, int64_t N, float* Y) {
  using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Eigen::Map<const RowMat> x(X, T, K), w(W, N, K);
  Eigen::Map<RowMat> y(Y, T, N);
  y.noalias() = x * w.transpose();
}

}  // namespace tandem::cpu
