// The reference model on NVIDIA GPUs: the CPU model's twin (same decoder, same paged KV
// layout and block ids from policies/), with bf16 weights and KV cache and fp32 accumulation.
// Plain C++ interface: the CUDA types stay inside backend/cuda.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/llama.h"
#include "backend/cuda/kv_pool_view.h"
#include "backend/cuda/row_kernels.h"
#include "backend/specs.h"
#include "policies/plan.h"

namespace tandem::cuda {

// CUDA cores (fp32 Q and P), tensor cores (bf16 Q and P), split-KV on the CUDA cores (fixed
// splits of 64 keys folded in order; spread over the GPU for small steps), or split-KV on the
// tensor cores: four functions.
enum class AttentionKernel { Simt, Mma, Split, MmaSplit };

struct CudaModelOptions {
  AttentionKernel attention = AttentionKernel::Simt;
  // RMSNorm and RoPE (row_kernels.h): V2 issues its loads first, the same bits.
  RowKernels row_kernels = RowKernels::V1;
  bool deterministic = true;       // batch/chunk-invariant (pinned GEMM algorithms); false: cuBLAS heuristics
  bool cuda_graph = true;          // decode steps replay a graph captured per batch-size bucket (TP 1)
  int32_t tp = 1;                  // GPUs first_device..first_device+tp-1, one rank each, NCCL all-reduce
  int32_t first_device = 0;        // a second instance in one process takes its own GPUs (stage 4)
  bool nccl_at_tp1 = false;        // route TP 1 through NCCL too (tests: must match the plain path bit for bit)
  int32_t gemm_pin_tokens = 256;   // deterministic mode: the step size whose best algorithm is used for all
  bool gemm_own_kernel = false;    // the own tensor-core GEMM for every shape, either mode (engine.cuda_gemm: own)
  int32_t max_step_tokens = 8192;  // activation buffers are sized once for this (graphs keep pointers)
  int32_t max_step_seqs = 256;
  int64_t kv_staging_bytes = int64_t{64} << 20;  // block reads and writes move in chunks of this (tests: small)
};

struct CudaModelStats {
  int64_t eager_steps = 0, graph_captures = 0, graph_replays = 0;
  // Split-KV attention: steps enqueued (run eagerly or captured) whose attention spread its
  // splits over the GPU, and steps that walked them in each block (tests: both ways ran).
  int64_t split_spread_steps = 0, split_inblock_steps = 0;
};

class CudaModel {
 public:
  // host_weights: uploaded as bf16 (checkpoints, and tests that compare with the CPU model);
  // nullptr: dummy weights generated on the device from `seed`.
  CudaModel(const ModelSpec& m, const cpu::LlamaWeights* host_weights, uint64_t seed, int32_t num_blocks,
            int32_t block_size, const CudaModelOptions& opt);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  // Runs one step and waits for it. Appends one argmax id per sampling sequence to `sampled`;
  // if `logits` is given, also those sequences' logits rows ([num_samples][V]).
  void forward(const StepPlan& plan, std::span<const Token> tokens, std::vector<Token>& sampled,
               std::vector<float>* logits = nullptr);
  // Benchmarks: random K/V in every block, so decode can be timed over a long context
  // without prefilling it first (never on zeros, which run faster than real data).
  void randomize_kv_cache(uint64_t seed);
  const ModelSpec& spec() const;
  CudaModelStats stats() const;

  // The KV cache as whole blocks (stage 4: kv_store_i, the device channels). A block's bytes, in
  // the host buffers of read/write: for each rank, for each layer, K then V (the CPU model's
  // order), bf16 as stored. Both calls return when their copies are done. They run on streams of
  // their own, so another thread's step may run meanwhile, on other blocks (a transfer reads
  // blocks whose steps have returned and writes blocks no step reads until it has returned).
  int64_t kv_block_bytes() const;  // all ranks
  int32_t kv_num_blocks() const;
  // out.size() == blocks.size() * kv_block_bytes(), blocks in order; ids are checked.
  void read_kv_blocks(std::span<const int32_t> blocks, std::span<std::byte> out);
  void write_kv_blocks(std::span<const int32_t> blocks, std::span<const std::byte> in);
  std::vector<KvPoolView> kv_pools() const;  // by rank
  // Devices and the pinned GEMM algorithm of each weight shape, for logs and reports.
  std::string describe() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::cuda
