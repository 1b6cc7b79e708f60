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
// The most segments a reduction is split into (tensor parallelism up to 8 ranks).
constexpr int32_t kMaxReductionSegments = 8;
// gemm_nt with K cut into `segments` equal runs (1-8, dividing K): each element is the pairwise
// tree_sum of the runs' fixed-order dots. A row-split GEMM of tensor parallelism computes a
// subtree of that tree on each rank and the all-reduce the rest, so every TP degree that divides
// `segments` gives the same bits (see LlamaModel). Batch-invariant as gemm_nt.
void gemm_nt_segmented(const float* X, int64_t T, int64_t K, const float* W, int64_t N, float* Y, int32_t segments);
// The dot of gemm_nt_segmented for one element.
float segmented_dot(const float* a, const float* b, int64_t n, int32_t segments);
// Sums v[0..n) pairwise, level by level (v is overwritten): ((v0 + v1) + (v2 + v3)) + ...
float tree_sum(float* v, int64_t n);
// The same product through Eigen's GEMM (blocking depends on the shapes, so not invariant).
// Used to measure what the numerics contract costs.
void gemm_nt_eigen(const float* X, int64_t T, int64_t K, const float* W, int64_t N, float* Y);

// gemm_nt on the calling thread only (for callers that parallelise an outer loop), with row
// strides: X rows ldx apart, W rows ldw apart, Y rows ldy apart. Same per-element order.
void gemm_nt_serial(const float* X, int64_t ldx, int64_t T, int64_t K, const float* W, int64_t ldw, int64_t N, float* Y,
                    int64_t ldy);

// x[i] = exp(x[i]) by one 8-lane polynomial (Cephes' expf, relative error ~1e-7). Each element's
// result depends only on its own value: the tail is evaluated padded, by the same code.
void exp_inplace(float* x, int64_t n);
// Sum in the fixed order of dot(): lane i % 8 in ascending i, then the same tree.
float lane_sum(const float* x, int64_t n);

// out[d] = sum_j p[j] * rows[j][d], bit-identical to gemm_nt(P, V^T) with V^T[d][j] = rows[j][d]
// (lane j % 8, ascending j, the same tree), without transposing V: decode attention reads
// values straight from the paged cache.
void weighted_rows_sum(const float* p, int64_t n, const float* const* rows, int64_t d, float* out);

// Fixed-order dot product (the same lanes and tree as gemm_nt).
float dot(const float* a, const float* b, int64_t n);
// y = x / sqrt(mean(x^2) + eps) * w, one row.
void rms_norm(const float* x, const float* w, int64_t n, float eps, float* y);

// Threads used by the kernels (OpenMP); 0 means all cores. Throws InputError (bad
// --threads) outside [0, 1024].
void set_threads(int n);
int threads();

}  // namespace tandem::cpu
