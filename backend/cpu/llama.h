// The reference model: a Llama-style decoder (RMSNorm, RoPE, grouped-query attention over
// the paged KV cache, SwiGLU, LM head, greedy argmax) in fp32 on the CPU. The CUDA backend
// is its twin. K/V live in the blocks that policies/ allocates: a plan's block table indexes
// this store directly, so there is one source of truth for block ids.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/comm.h"
#include "backend/specs.h"
#include "backend/transfer/kv_layout.h"
#include "policies/plan.h"

namespace tandem::cpu {

struct LlamaLayer {
  std::vector<float> attn_norm;  // [h]
  std::vector<float> wqkv;       // [(H + 2 KV) * hd][h]: q, k, v projections stacked (one GEMM)
  std::vector<float> wo;         // [h][H * hd]
  std::vector<float> mlp_norm;   // [h]
  std::vector<float> w_gate_up;  // [2 ffn][h]: gate then up (one GEMM)
  std::vector<float> w_down;     // [h][ffn]
};

struct LlamaWeights {
  std::vector<float> embed;  // [V][h]
  std::vector<LlamaLayer> layers;
  std::vector<float> final_norm;  // [h]
  std::vector<float> lm_head;     // [V][h] (a copy of embed when tied)
};

// Dummy weights from a seed, as serving benchmarks use: any shape runs anywhere.
LlamaWeights dummy_weights(const ModelSpec& m, uint64_t seed);
// What identifies these weights in a KV layout (prefill and decode must run the same ones): an
// XXH3 of every tensor's size and of up to 4,096 of its values, evenly spaced, as
// "fp32 values #0123456789abcdef". Cheap at any size; two different weight sets would have to
// agree at every sampled value to collide.
std::string weights_fingerprint(const LlamaWeights& w);
// Throws InputError if fp32 weights plus `kv_bytes` would not fit in this machine's memory.
void check_fits_in_memory(const ModelSpec& m, double kv_bytes);
// Weights of a Hugging Face checkpoint folder; fills the shape fields of `m` from config.json.
LlamaWeights load_checkpoint(const std::string& folder, ModelSpec& m);

// RoPE cos/sin tables, [positions][head_dim / 2]; the CUDA backend uploads the same ones.
// positions: rope_positions() (what can run), not max_model_len (which may be 2^31).
void rope_tables(const ModelSpec& m, std::vector<float>& cos_table, std::vector<float>& sin_table, int64_t positions);
// The positions a model with this KV cache can reach: no sequence is longer than
// max_model_len, nor than the whole cache (num_blocks * block_size tokens).
int64_t rope_positions(const ModelSpec& m, int32_t num_blocks, int32_t block_size);

// K and V of every layer, laid out [layer][block][slot][kv_head][head_dim].
class PagedKvStore {
 public:
  PagedKvStore(int32_t layers, int32_t kv_heads, int32_t head_dim, int32_t num_blocks, int32_t block_size);
  float* k(int32_t layer, int32_t block, int32_t slot) { return &k_[offset(layer, block, slot)]; }
  float* v(int32_t layer, int32_t block, int32_t slot) { return &v_[offset(layer, block, slot)]; }
  int32_t block_size() const { return block_size_; }
  int32_t num_blocks() const { return num_blocks_; }
  // Floats of one layer's K (or V) of one block.
  size_t block_floats() const { return size_t(block_size_) * token_stride_; }

 private:
  size_t offset(int32_t layer, int32_t block, int32_t slot) const {
    return ((size_t(layer) * size_t(num_blocks_) + size_t(block)) * size_t(block_size_) + size_t(slot)) * token_stride_;
  }
  int32_t num_blocks_, block_size_;
  size_t token_stride_;
  std::vector<float> k_, v_;
};

enum class GemmPath { Invariant, Eigen };

class LlamaModel {
 public:
  // tp > 1: Megatron-style tensor parallelism over in-process ranks (threads): q/k/v and
  // gate/up split by columns (heads, ffn slices), o and down by rows, one all-reduce after
  // attention and one after the MLP; embedding and LM head replicated. The KV cache is split
  // by KV heads: every rank holds its heads for the same block ids.
  // TP-invariant: o and down reduce over ModelSpec::reduction_segments() runs as a pairwise
  // tree, a rank computing its runs' subtree and the all-reduce the levels above, so a TP degree
  // dividing the segments gives TP 1's bits (logits, KV, tokens); another degree is a valid
  // split whose sums differ in the last bits.
  LlamaModel(const ModelSpec& m, LlamaWeights w, int32_t num_blocks, int32_t block_size, int32_t tp = 1);
  // Runs one step. `tokens` holds each sequence's num_tokens input ids, in plan order.
  // Appends one argmax id per sampling sequence to `sampled`; if `logits` is given, also
  // the full logits rows of those sequences ([num_samples][V]).
  void forward(const StepPlan& plan, std::span<const Token> tokens, std::vector<Token>& sampled,
               std::vector<float>* logits = nullptr);
  void set_gemm_path(GemmPath p) { gemm_path_ = p; }
  const ModelSpec& spec() const { return m_; }
  int32_t tp() const { return int32_t(shards_.size()); }
  // The KV of whole blocks as bytes (prefill/decode separation): per block, per rank, per
  // layer, K then V, as each rank stores them. Both instances of one tp read the same layout.
  int64_t kv_block_bytes() const;
  KvLayout kv_layout() const;
  int32_t kv_num_blocks() const { return shards_[0].kv.num_blocks(); }
  void read_kv_blocks(std::span<const int32_t> blocks, std::span<std::byte> out);
  void write_kv_blocks(std::span<const int32_t> blocks, std::span<const std::byte> in);

 private:
  // Attention scratch, one per thread, kept across steps: fresh buffers would cost page
  // faults and zeroing on every step (and differently in a live run than in calibration).
  struct AttnScratch {
    std::vector<float> Q, K, Vt, S, O;
    std::vector<const float*> krow, vrow;
  };
  // One rank: its heads and MLP slice, the K/V of its KV heads, its scratch.
  struct Shard {
    int32_t heads, kv_heads, ffn;
    int32_t segments;                  // of the row-split reductions, on this rank (gemm_nt_segmented)
    std::vector<LlamaLayer> layers{};  // wqkv, wo, w_gate_up, w_down (norms live in w_)
    PagedKvStore kv;
    std::vector<float> qkv{}, attn{}, gu{}, act{}, partial{};
    std::vector<AttnScratch> scratch{};
  };

  void gemm(const float* x, int64_t t, int64_t k, const std::vector<float>& w, int64_t n, float* y,
            int32_t segments = 1) const;
  void attention_block(Shard& sh, int32_t layer, const StepPlan& plan, int64_t T);
  void mlp_block(Shard& sh, int32_t layer, int64_t T);
  void attention(Shard& sh, int32_t layer, const StepPlan& plan, const float* qkv, float* out);
  template <class F>
  void each_rank(F&& f);
  void add_reduced_partials(int64_t n);

  ModelSpec m_;
  std::string weights_id_;  // weights_fingerprint of the weights it was built from
  LlamaWeights w_;          // embedding, norms, LM head (matrices of the layers move into the shards)
  std::vector<Shard> shards_;
  cpu::InProcessCommunicator comm_;
  GemmPath gemm_path_ = GemmPath::Invariant;
  std::vector<float> rope_cos_, rope_sin_;  // [rope_positions()][hd/2]
  // Scratch, reused across steps.
  std::vector<float> x_, xn_, last_, logits_;
  std::vector<int32_t> pos_of_, seq_of_;
};

}  // namespace tandem::cpu
