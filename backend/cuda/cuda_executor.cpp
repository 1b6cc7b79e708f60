#include "backend/cuda/cuda_executor.h"

#include <chrono>

#include "backend/cuda/cuda_model.h"

namespace tandem::cuda {

namespace {
class CudaExecutor final : public executor_i {
 public:
  CudaExecutor(const ModelSpec& m, const cpu::LlamaWeights* w, uint64_t seed, int32_t blocks, int32_t block_size,
               const CudaModelOptions& opt)
      : model_(m, w, seed, blocks, block_size, opt) {}
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

 private:
  CudaModel model_;
};
}  // namespace

std::unique_ptr<executor_i> make_cuda_executor(ModelSpec& m, uint64_t seed, const CudaExecutorOptions& e) {
  const CudaModelOptions opt{.attention = e.mma_attention ? AttentionKernel::Mma : AttentionKernel::Simt,
                             .deterministic = e.deterministic,
                             .cuda_graph = e.cuda_graph,
                             .tp = e.tp,
                             .first_device = e.device,
                             .max_step_tokens = e.max_step_tokens,
                             .max_step_seqs = e.max_step_seqs};
  if (m.checkpoint.empty()) return std::make_unique<CudaExecutor>(m, nullptr, seed, e.kv_blocks, e.block_size, opt);
  const cpu::LlamaWeights w = cpu::load_checkpoint(m.checkpoint, m);  // fp32 on the host, bf16 on the device
  return std::make_unique<CudaExecutor>(m, &w, seed, e.kv_blocks, e.block_size, opt);
}

}  // namespace tandem::cuda
