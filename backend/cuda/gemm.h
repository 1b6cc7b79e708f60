// The backend's GEMMs through cuBLASLt: Y[T][N] (fp32) = X[T][K] (bf16) * W[N][K]^T (bf16),
// fp32 accumulation.
//
// Deterministic mode (the default) makes a row of Y independent of T: cuBLAS picks other
// kernels, tiles and split-K factors as T changes, and each changes the order in which an
// element's K products are summed. So for every weight shape (N, K) one algorithm is chosen
// once, at T = pin_tokens, among those without split-K and without a reduction scheme, and
// used for every T. Before it is pinned, a candidate is run on random data at several T and
// must give the same rows bit for bit (a kernel that splits K by the number of tiles, as a
// stream-K schedule would, fails this and the next candidate is tried). If none passes, the
// shape runs on the backend's own tensor-core GEMM (kernels.h: gemm_invariant), slower but
// invariant by construction. Fast mode asks the heuristic for each T (split-K allowed) and
// is not batch-invariant.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/buffer.h"
#include "backend/cuda/check.h"

namespace tandem::cuda {

// No cuBLASLt algorithm for a shape is row-invariant (deterministic mode then uses the own GEMM).
class NoInvariantAlgorithm : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Gemm {
 public:
  // Uses the current device. max_tokens: the largest step; a pinned algorithm must accept
  // every size from 1 to it. own_kernel: the own GEMM for every shape, in either mode (tests;
  // otherwise deterministic mode uses it only where no cuBLASLt algorithm qualifies).
  Gemm(bool deterministic, int32_t pin_tokens, int64_t max_tokens = 8192, bool own_kernel = false);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  void run(const __nv_bfloat16* X, int64_t T, int64_t K, const __nv_bfloat16* W, int64_t N, float* Y, cudaStream_t s);
  // The same with a bf16 output (for the benchmark of the bf16 GEMM rate).
  void run_bf16_out(const __nv_bfloat16* X, int64_t T, int64_t K, const __nv_bfloat16* W, int64_t N, __nv_bfloat16* Y,
                    cudaStream_t s);
  // What the pinned algorithm of a shape is, for logs: "algo 21 tile 20 stages 8 splitK 1".
  std::string describe(int64_t N, int64_t K, bool bf16_out = false);
  bool deterministic() const { return deterministic_; }

 private:
  struct Shape {
    int64_t N, K;
    bool bf16_out;
    auto operator<=>(const Shape&) const = default;
  };
  cublasLtMatrixLayout_t layout(cudaDataType_t type, int64_t rows, int64_t cols);
  const cublasLtMatmulAlgo_t& algo_for(const Shape& shape, int64_t T);
  std::vector<cublasLtMatmulAlgo_t> candidates(const Shape& shape, int64_t T, bool no_reduction);
  bool usable_everywhere(const Shape& shape, cublasLtMatmulAlgo_t& algo);
  bool valid_at(const Shape& shape, const cublasLtMatmulAlgo_t& algo, int64_t T);
  int64_t check_rows() const;
  bool rows_invariant_on_device(const Shape& shape, const cublasLtMatmulAlgo_t& algo);
  bool uses_own_kernel(const Shape& shape);
  void matmul(const void* X, int64_t T, const void* W, const Shape& shape, void* Y, cudaStream_t s);

  bool deterministic_;
  int32_t pin_tokens_;
  int64_t max_tokens_;
  std::map<Shape, std::string> notes_;  // pinning: candidates rejected, checks skipped, fallbacks
  cublasLtHandle_t lt_ = nullptr;
  cublasLtMatmulDesc_t op_ = nullptr;
  DeviceBuffer<char> workspace_;
  std::map<std::tuple<int, int64_t, int64_t>, cublasLtMatrixLayout_t> layouts_;
  std::map<Shape, cublasLtMatmulAlgo_t> pinned_;  // deterministic
  std::map<Shape, bool> own_;                     // deterministic: own kernel instead
  bool force_own_ = false;
  std::map<std::tuple<Shape, int64_t>, cublasLtMatmulAlgo_t> per_tokens_;  // fast
};

}  // namespace tandem::cuda
