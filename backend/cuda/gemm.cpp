#include "backend/cuda/gemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/kernels.h"

namespace tandem::cuda {

namespace {
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

template <class V>
V algo_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  V v{};
  size_t written = 0;
  TANDEM_CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof v, &written));
  return v;
}
}  // namespace

Gemm::Gemm(bool deterministic, int32_t pin_tokens, int64_t max_tokens, bool own_kernel)
    : deterministic_(deterministic),
      pin_tokens_(pin_tokens),
      max_tokens_(std::max<int64_t>(max_tokens, pin_tokens)),
      workspace_(kWorkspaceBytes),
      force_own_(own_kernel) {
  TANDEM_CUBLAS_CHECK(cublasLtCreate(&lt_));
  TANDEM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // Row-major Y = X W^T is column-major Y^T = W X^T with W read transposed: A = W (op T), B = X.
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
}

Gemm::~Gemm() {
  for (auto& [key, l] : layouts_) (void)cublasLtMatrixLayoutDestroy(l);
  if (op_) (void)cublasLtMatmulDescDestroy(op_);
  if (lt_) (void)cublasLtDestroy(lt_);
}

cublasLtMatrixLayout_t Gemm::layout(cudaDataType_t type, int64_t rows, int64_t cols) {
  auto [it, fresh] = layouts_.try_emplace({int(type), rows, cols}, nullptr);
  if (fresh) TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&it->second, type, uint64_t(rows), uint64_t(cols), rows));
  return it->second;
}

std::vector<cublasLtMatmulAlgo_t> Gemm::candidates(const Shape& sh, int64_t T, bool no_reduction) {
  cublasLtMatmulPreference_t pref = nullptr;
  TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  TANDEM_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  if (no_reduction) {
    const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
    TANDEM_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &none, sizeof none));
  }
  std::vector<cublasLtMatmulHeuristicResult_t> results(32);
  int count = 0;
  const cudaDataType_t out_type = sh.bf16_out ? CUDA_R_16BF : CUDA_R_32F;
  const auto A = layout(CUDA_R_16BF, sh.K, sh.N), B = layout(CUDA_R_16BF, sh.K, T), D = layout(out_type, sh.N, T);
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt_, op_, A, B, D, D, pref, int(results.size()), results.data(), &count);
  (void)cublasLtMatmulPreferenceDestroy(pref);
  std::vector<cublasLtMatmulAlgo_t> algos;
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) return algos;  // no candidate under these preferences
  TANDEM_CUBLAS_CHECK(st);
  for (int i = 0; i < count; ++i)
    if (results[size_t(i)].state == CUBLAS_STATUS_SUCCESS) algos.push_back(results[size_t(i)].algo);
  return algos;
}

// A pinned algorithm must run every step size with one K order: no split-K, no reduction,
// and valid at every size the model or the check below runs (the heuristic answered for
// pin_tokens only).
bool Gemm::usable_everywhere(const Shape& sh, cublasLtMatmulAlgo_t& algo) {
  if (algo_config<int32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) > 1 ||
      algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) != CUBLASLT_REDUCTION_SCHEME_NONE) {
    // Try the same kernel without the split: set K splits to 1 and no reduction.
    const int32_t one = 1;
    const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
    if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof one) !=
            CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none, sizeof none) !=
            CUBLAS_STATUS_SUCCESS)
      return false;
  }
  for (const int64_t t : {int64_t(1), int64_t(7), int64_t(129), check_rows(), max_tokens_})
    if (!valid_at(sh, algo, t)) return false;
  return true;
}

bool Gemm::valid_at(const Shape& sh, const cublasLtMatmulAlgo_t& algo, int64_t T) {
  cublasLtMatmulHeuristicResult_t check{};
  const auto A = layout(CUDA_R_16BF, sh.K, sh.N), B = layout(CUDA_R_16BF, sh.K, T),
             D = layout(sh.bf16_out ? CUDA_R_16BF : CUDA_R_32F, sh.N, T);
  return cublasLtMatmulAlgoCheck(lt_, op_, A, B, D, D, &algo, &check) == CUBLAS_STATUS_SUCCESS &&
         check.workspaceSize <= kWorkspaceBytes;
}

const cublasLtMatmulAlgo_t& Gemm::algo_for(const Shape& sh, int64_t T) {
  if (!deterministic_) {
    const auto found = per_tokens_.find({sh, T});
    if (found != per_tokens_.end()) return found->second;
    const auto algos = candidates(sh, T, false);
    if (algos.empty())
      throw std::runtime_error(
          fmt::format("cuBLASLt offers no algorithm for a {}x{} weight at {} tokens", sh.N, sh.K, T));
    return per_tokens_[{sh, T}] = algos.front();
  }
  const auto found = pinned_.find(sh);
  if (found != pinned_.end()) {
    // A step larger than the sizes checked at pinning (the model grew its buffers): check it.
    if (T > max_tokens_ && !valid_at(sh, found->second, T))
      throw std::runtime_error(
          fmt::format("the pinned cuBLASLt algorithm for a {}x{} weight does not run {} tokens", sh.N, sh.K, T));
    return found->second;
  }
  // The heuristic's order among the algorithms without a reduction; failing those, its
  // general candidates with the split taken out. A candidate that fails to run is skipped.
  std::string& why = notes_[sh];
  // The step that first uses this shape may still run (and shares the workspace): the
  // checks below start on an idle device. A fault from earlier work surfaces here, not as a
  // rejected candidate.
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  for (const bool no_reduction : {true, false})
    for (cublasLtMatmulAlgo_t algo : candidates(sh, pin_tokens_, no_reduction)) {
      try {
        if (usable_everywhere(sh, algo) && rows_invariant_on_device(sh, algo)) return pinned_[sh] = algo;
      } catch (const std::runtime_error& e) {
        why += fmt::format(" [candidate failed: {}]", e.what());
      }
    }
  throw NoInvariantAlgorithm(fmt::format("cuBLASLt offers no row-invariant algorithm for a {}x{} weight", sh.N, sh.K));
}

// The own kernel for this shape? Decided once, when the shape is first used: forced, or (in
// deterministic mode) no cuBLASLt algorithm qualified. Other errors are not hidden.
bool Gemm::uses_own_kernel(const Shape& sh) {
  if (force_own_) return true;
  if (!deterministic_) return false;
  const auto found = own_.find(sh);
  if (found != own_.end()) return found->second;
  bool own = false;
  try {
    (void)algo_for(sh, pin_tokens_);
  } catch (const NoInvariantAlgorithm& e) {
    own = true;
    notes_[sh] += fmt::format(" [{}; own GEMM used]", e.what());
  }
  return own_[sh] = own;
}

int64_t Gemm::check_rows() const { return std::max<int64_t>(pin_tokens_, 129); }

// Runs `algo` on random data at check_rows() rows and at 1, 7 and 129 of them: the shared rows
// must be bit-identical. Synchronous on the legacy stream, on an idle device (algo_for waits
// for it); done once per shape, never under graph capture (a bucket runs eagerly before it is captured). If the
// scratch cannot be allocated the check is skipped, and the shape's note says so.
bool Gemm::rows_invariant_on_device(const Shape& sh, const cublasLtMatmulAlgo_t& algo) {
  const int64_t rows = check_rows(), out_bytes = sh.bf16_out ? 2 : 4;
  DeviceBuffer<char> x, w, y_all, y_part;
  try {
    x.resize(size_t(rows * sh.K) * 2);
    w.resize(size_t(sh.N * sh.K) * 2);
    y_all.resize(size_t(rows * sh.N * out_bytes));
    y_part.resize(y_all.size());
  } catch (const std::runtime_error&) {
    (void)cudaGetLastError();
    notes_[sh] += " [invariance not checked: no scratch memory]";
    return true;
  }
  fill_uniform(reinterpret_cast<bf16*>(x.get()), rows, sh.K, sh.K, 0, 0, 77, 0, 1.0f, nullptr);
  fill_uniform(reinterpret_cast<bf16*>(w.get()), sh.N, sh.K, sh.K, 0, 0, 77, 1, 0.05f, nullptr);
  const auto run_rows = [&](int64_t t, char* y) {
    const auto A = layout(CUDA_R_16BF, sh.K, sh.N), B = layout(CUDA_R_16BF, sh.K, t),
               D = layout(sh.bf16_out ? CUDA_R_16BF : CUDA_R_32F, sh.N, t);
    const float one = 1.0f, zero = 0.0f;
    TANDEM_CUBLAS_CHECK(cublasLtMatmul(lt_, op_, &one, w.get(), A, x.get(), B, &zero, y, D, y, D, &algo,
                                       workspace_.get(), kWorkspaceBytes, nullptr));
  };
  run_rows(rows, y_all.get());
  std::vector<char> a, b;
  bool same = true;
  for (const int64_t t : {int64_t(1), int64_t(7), int64_t(129)}) {
    run_rows(t, y_part.get());
    const size_t bytes = size_t(t * sh.N * out_bytes);
    a.resize(bytes);
    b.resize(bytes);
    TANDEM_CUDA_CHECK(cudaMemcpy(a.data(), y_all.get(), bytes, cudaMemcpyDeviceToHost));
    TANDEM_CUDA_CHECK(cudaMemcpy(b.data(), y_part.get(), bytes, cudaMemcpyDeviceToHost));
    same = same && a == b;
  }
  if (!same)
    notes_[sh] +=
        fmt::format(" [algo {} not row-invariant: skipped]", algo_config<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID));
  return same;
}

void Gemm::matmul(const void* X, int64_t T, const void* W, const Shape& sh, void* Y, cudaStream_t s) {
  if (T == 0) return;
  if (uses_own_kernel(sh)) {
    const auto* x = static_cast<const bf16*>(X);
    const auto* w = static_cast<const bf16*>(W);
    // The skinny kernel (same bits) only where the own GEMM was chosen (engine.cuda_gemm: own);
    // a deterministic-mode fallback shape keeps the tiled kernel measured on the H200.
    if (sh.bf16_out)
      gemm_invariant(x, T, sh.K, w, sh.N, static_cast<bf16*>(Y), s, force_own_);
    else
      gemm_invariant(x, T, sh.K, w, sh.N, static_cast<float*>(Y), s, force_own_);
    return;
  }
  const cublasLtMatmulAlgo_t& algo = algo_for(sh, T);
  const auto A = layout(CUDA_R_16BF, sh.K, sh.N), B = layout(CUDA_R_16BF, sh.K, T),
             D = layout(sh.bf16_out ? CUDA_R_16BF : CUDA_R_32F, sh.N, T);
  const float one = 1.0f, zero = 0.0f;
  TANDEM_CUBLAS_CHECK(
      cublasLtMatmul(lt_, op_, &one, W, A, X, B, &zero, Y, D, Y, D, &algo, workspace_.get(), kWorkspaceBytes, s));
}

void Gemm::run(const __nv_bfloat16* X, int64_t T, int64_t K, const __nv_bfloat16* W, int64_t N, float* Y,
               cudaStream_t s) {
  matmul(X, T, W, Shape{N, K, false}, Y, s);
}

void Gemm::run_bf16_out(const __nv_bfloat16* X, int64_t T, int64_t K, const __nv_bfloat16* W, int64_t N,
                        __nv_bfloat16* Y, cudaStream_t s) {
  matmul(X, T, W, Shape{N, K, true}, Y, s);
}

std::string Gemm::describe(int64_t N, int64_t K, bool bf16_out) {
  const Shape sh{N, K, bf16_out};
  if (uses_own_kernel(sh))
    return std::string("own tensor-core GEMM (gemm_invariant") + (force_own_ ? ", skinny up to 64 rows)" : ")") +
           notes_[sh];
  const cublasLtMatmulAlgo_t& algo = algo_for(sh, pin_tokens_);
  return fmt::format("algo {} tile {} stages {} splitK {} swizzle {} cluster {}{}",
                     algo_config<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID),
                     algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                     algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                     algo_config<int32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                     algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                     algo_config<uint16_t>(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), notes_[sh]);
}

}  // namespace tandem::cuda
