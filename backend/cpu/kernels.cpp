#include "backend/cpu/kernels.h"

#include <Eigen/Core>
#include <cmath>

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
inline Acc fma8(const float* a, const float* b, Acc c) { return _mm256_fmadd_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(b), c); }
inline void store8(Acc v, float* out) { _mm256_storeu_ps(out, v); }
#else
struct Acc { float v[8]; };
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

void set_threads(int n) { g_threads = n; }
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

void gemm_nt(const float* X, int64_t T, int64_t K, const float* W, int64_t N, float* Y) {
  const int64_t k8 = K / 8 * 8;
  const int64_t n_tiles = (N + 3) / 4;
  // Tiles of 4 outputs x 2 tokens share loads; every element still sees exactly the
  // fma8 sequence of dot() over its own row and column.
#pragma omp parallel for schedule(static) num_threads(threads()) if (T * N * K > (1 << 18))
  for (int64_t tile = 0; tile < n_tiles; ++tile) {
    const int64_t n0 = tile * 4;
    if (n0 + 4 > N) {  // ragged edge: plain fixed-order dots
      for (int64_t n = n0; n < N; ++n)
        for (int64_t t = 0; t < T; ++t) Y[t * N + n] = dot(X + t * K, W + n * K, K);
      continue;
    }
    const float* w0 = W + n0 * K;
    const float *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
    int64_t t = 0;
    for (; t + 2 <= T; t += 2) {
      const float* x0 = X + t * K;
      const float* x1 = x0 + K;
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
      float* y0 = Y + t * N + n0;
      float* y1 = y0 + N;
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
      const float* x0 = X + t * K;
      Acc a0 = acc_zero(), a1 = acc_zero(), a2 = acc_zero(), a3 = acc_zero();
      for (int64_t k = 0; k < k8; k += 8) {
        a0 = fma8(x0 + k, w0 + k, a0);
        a1 = fma8(x0 + k, w1 + k, a1);
        a2 = fma8(x0 + k, w2 + k, a2);
        a3 = fma8(x0 + k, w3 + k, a3);
      }
      float* y0 = Y + t * N + n0;
      y0[0] = finish(a0, x0, w0, k8, K);
      y0[1] = finish(a1, x0, w1, k8, K);
      y0[2] = finish(a2, x0, w2, k8, K);
      y0[3] = finish(a3, x0, w3, k8, K);
    }
  }
}

void gemm_nt_eigen(const float* X, int64_t T, int64_t K, const float* W, int64_t N, float* Y) {
  using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Eigen::Map<const RowMat> x(X, T, K), w(W, N, K);
  Eigen::Map<RowMat> y(Y, T, N);
  y.noalias() = x * w.transpose();
}

}  // namespace tandem::cpu
