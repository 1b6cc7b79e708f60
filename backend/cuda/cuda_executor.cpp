#include "backend/cuda/cuda_executor.h"

#include <fmt/format.h>

#include <chrono>

#include "backend/cuda/cuda_model.h"
#include "backend/model_kv_store.h"

namespace tandem::cuda {

namespace {
// Its KV store is the model's cache as whole blocks (CudaModel::read_kv_blocks), the layout the
// same on every instance of one model, block size and tensor-parallel degree.
class CudaExecutor final : public executor_i, public ModelKvStore<CudaModel> {
 public:
  CudaExecutor(const ModelSpec& m, const cpu::LlamaWeights* w, uint64_t seed, int32_t blocks, int32_t block_size,
               const CudaModelOptions& opt)
      : ModelKvStore(model_),
        model_(m, w, seed, blocks, block_size, opt),
        layout_(llama_kv_layout(m, w ? cpu::weights_fingerprint(*w) : fmt::format("generated on the GPU, seed {}", seed),
                                "bf16", block_size, opt.tp)) {}
  // The step's wall time, from the first metadata copy to the sampled tokens on the host.
  StepResult execute(const StepPlan& plan) override {
    StepResult r;
    const auto t0 = std::chrono::steady_clock::now();
    model_.forward(plan, plan.tokens, r.sampled);
    r.elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }
  std::string name() const override { return "cuda"; }
  bool simulated() const override { return false; }
  kv_store_i* kv_store() override { return this; }
  KvLayout kv_layout() const override { return layout_; }
  CudaModel& model() { return model_; }

 private:
  CudaModel model_;
  KvLayout layout_;
};
}  // namespace

CudaModel* cuda_model_of(executor_i& exec) {
  auto* cuda = dynamic_cast<CudaExecutor*>(&exec);
  return cuda ? &cuda->model() : nullptr;
}

std::unique_ptr<executor_i> make_cuda_executor(ModelSpec& m, uint64_t seed, const CudaExecutorOptions& e) {
  const AttentionKernel attention = e.attention == 1   ? AttentionKernel::Mma
                                    : e.attention == 2 ? AttentionKernel::Split
                                    : e.attention == 3 ? AttentionKernel::MmaSplit
                                                       : AttentionKernel::Simt;
  const CudaModelOptions opt{.attention = attention,
                             .row_kernels = e.row_kernels == 2 ? RowKernels::V2 : RowKernels::V1,
                             .deterministic = e.deterministic,
                             .cuda_graph = e.cuda_graph,
                             .tp = e.tp,
                             .first_device = e.device,
                             .gemm_own_kernel = e.own_gemm,
                             .max_step_tokens = e.max_step_tokens,
                             .max_step_seqs = e.max_step_seqs};
  if (m.checkpoint.empty()) return std::make_unique<CudaExecutor>(m, nullptr, seed, e.kv_blocks, e.block_size, opt);
  const cpu::LlamaWeights w = cpu::load_checkpoint(m.checkpoint, m);  // fp32 on the host, bf16 on the device
  return std::make_unique<CudaExecutor>(m, &w, seed, e.kv_blocks, e.block_size, opt);
}

}  // namespace tandem::cuda
