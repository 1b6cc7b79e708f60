// CPU kernels of the reference model. The batch-invariant ones fix each output element's
// reduction order by construction: an 8-lane fused multiply-add over the reduction index in
// ascending order, then one fixed tree over the lanes. An element's value therefore depends
// only on its own row and column, never on how many rows are in the batch or which tile it
// fell into. This is what makes the golden test (feature on vs off) exact.
#pragma once
#include <cstdint>

namespace tandem::cpu {

// Y[t][n] = sum_k X[t][k] * W[n][k]   (X: T x K row-major, W: N x K row-major, Y: T x N)
// Batch-invariant: Y[t][n] is bit-identical for any T and any other rows of X.
void gemm_nt(const float* X, int64_t T, int64_t K, const float* W, int64_t N, float* Y);
// The same product through Eigen's GEMM (blocking depends on the shapes, so not invariant).
// Used to measure what the numerics contract costs.
void gemm_nt_eigen(const float* X, int64_t T, int64_t K, const float* W, int64_t N, float* Y);

// Fixed-order dot product (the same lanes and tree as gemm_nt).
float dot(const float* a, const float* b, int64_t n);
// y = x / sqrt(mean(x^2) + eps) * w, one row.
void rms_norm(const float* x, const float* w, int64_t n, float eps, float* y);

// Threads used by the kernels (OpenMP); 0 means all cores.
void set_threads(int n);
int threads();

}  // namespace tandem::cpu
