// Model and hardware descriptions, shared by the cost models and (later) the real backends.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "backend/op_profile.h"

namespace tandem {

struct ModelSpec {
  std::string name;  // preset name, or "custom"
  int32_t layers = 0;
  int32_t hidden = 0;
  int32_t heads = 0;
  int32_t kv_heads = 0;
  int32_t ffn = 0;  // MLP intermediate size (SwiGLU's gate/up width; a two-matrix MLP's up width)
  int32_t vocab = 0;
  std::string dtype = "bf16";
  int32_t max_model_len = 0;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  bool tie_embeddings = false;  // LM head shares the embedding matrix
  std::string checkpoint;       // Hugging Face folder (config.json + *.safetensors); empty: dummy weights
  // The MLP: "swiglu" (Llama, Mistral, Yi: gate, up and down matrices) or a two-matrix MLP with an
  // elementwise activation, "gelu" (Falcon, GPT-style) or "relu" (OPT): up and down only. The
  // activation itself is not priced (elementwise, next to the GEMMs), so gelu and relu cost the same.
  std::string mlp = "swiglu";
  // "rope" (rotary: no weights) or "learned" (OPT, GPT-2: a max_model_len x hidden table, held
  // whole on every rank, gathered per token, never streamed through a GEMM).
  std::string positions = "rope";

  // The MLP's weight matrices per layer (each hidden x ffn).
  int32_t mlp_matrices() const { return mlp == "swiglu" ? 3 : 2; }
  // The decoder the real backends implement (backend/cpu/llama.h, backend/cuda): SwiGLU and RoPE.
  bool llama_decoder() const { return mlp == "swiglu" && positions == "rope"; }

  int32_t head_dim() const { return hidden / heads; }
  int32_t dtype_bytes() const;
  // Parameters of the linear layers of all decoder layers (q, k, v, o, and the MLP's matrices:
  // gate, up, down, or up, down). Biases (OPT) are left out: under 0.1% of these.
  double linear_params() const;
  // What is not in a decoder layer's GEMMs: the token embedding and the LM head (one matrix when
  // tied, as OPT's; two as Llama 3's), and a learned position table.
  double embedding_params() const {
    return (tie_embeddings ? 1.0 : 2.0) * hidden * vocab + (positions == "learned" ? double(max_model_len) * hidden : 0.0);
  }
  double params() const { return linear_params() + embedding_params(); }
  double weight_bytes() const { return params() * dtype_bytes(); }
  // The weights one of `tp` ranks holds, at the model dtype or at `value_bytes` per element:
  // the decoder layers' linear weights split over the ranks (Megatron: q/k/v, gate/up by
  // columns, o, down by rows), the embedding and LM head whole on every rank, as the CPU and
  // CUDA backends hold them (vLLM splits those by vocabulary too: its ranks hold less). At tp 1
  // this is weight_bytes().
  double weight_bytes_per_rank(int32_t tp) const { return weight_bytes_per_rank(tp, dtype_bytes()); }
  double weight_bytes_per_rank(int32_t tp, int32_t value_bytes) const {
    return (linear_params() / tp + embedding_params()) * value_bytes;
  }
  // K and V of one token, all layers, at the model dtype, or at `value_bytes` per element
  // (the CPU backend stores fp32, the CUDA backend bf16), on one of `tp` ranks.
  double kv_bytes_per_token() const { return kv_bytes_per_token(dtype_bytes()); }
  double kv_bytes_per_token(int32_t value_bytes, int32_t tp = 1) const {
    return 2.0 * layers * (kv_heads / tp) * head_dim() * value_bytes;
  }
  // Why the model cannot be split over `tp` ranks (heads, KV heads and ffn must divide),
  // e.g. "4 does not divide the model's KV heads (6)"; empty when it can.
  std::string tp_split_problem(int32_t tp) const;
  // The real backends' row-split reductions (attention output and MLP down projections) are cut
  // into this many equal runs, summed as a pairwise tree: the largest power of two dividing
  // heads, KV heads and ffn, at most 8. A TP degree that divides it computes the same bits as
  // TP 1 (the CPU backend; cpu/kernels.h gemm_nt_segmented): tp_invariant().
  int32_t reduction_segments() const;
  bool tp_invariant(int32_t tp) const { return tp >= 1 && reduction_segments() % tp == 0; }
};

// A cost model fitted to measured steps (tandem calibrate): step time as a linear function
// of the batch's features. Seconds per unit.
struct FittedCoefficients {
  std::string backend, model;  // what it was measured on: the workload's model must match
  int32_t threads = 0;
  double overhead_s = 0;           // per step
  double per_token_s = 0;          // per token computed (linear layers)
  double per_seq_s = 0;            // per sequence in the step
  double per_attn_pair_s = 0;      // per (query, key) pair of attention
  double per_context_token_s = 0;  // per context token read from the KV cache
  double per_sample_s = 0;         // per sampled sequence (LM head, argmax)
  double idle_factor = 1.0;        // multiplies a step that starts after the backend was idle
};

struct HardwareSpec {
  std::string name;
  double peak_flops = 0;                     // dense matrix FLOP/s at the model dtype
  double mem_bandwidth = 0;                  // bytes/s
  double step_overhead_s = 0;                // fixed cost of every step (launches, scheduling, sampling)
  double memory_bytes = 0;                   // device memory, to size the KV cache when not given
  double link_bandwidth = 0;                 // bytes/s per direction between devices (tensor parallelism)
  double link_latency_s = 0;                 // fixed cost of one all-reduce
  std::string source;                        // where the numbers come from (datasheet / measured / assumed)
  std::optional<FittedCoefficients> fitted;  // set: the fitted cost model replaces the roofline
  // Set: the profiled (per-operator, interpolated) cost model replaces the roofline. Shared:
  // a HardwareSpec is copied with its workload, the tables need not be.
  std::shared_ptr<const OperatorProfile> profiled;
  std::string profile_path;  // the profile file it came from (fitted or profiled)
};

// Named presets. Return nullopt for an unknown name.
std::optional<ModelSpec> model_preset(const std::string& name);
std::optional<HardwareSpec> hardware_preset(const std::string& name);
std::string model_preset_names();
std::string hardware_preset_names();

// A named link for the prefill-decode channel (disaggregation.channel.link): nominal bandwidth
// per direction and an assumed per-transfer latency; `source` says which is which.
struct LinkPreset {
  std::string name;
  double bandwidth_gbs = 0, latency_us = 0;
  std::string source;
};
std::optional<LinkPreset> link_preset(const std::string& name);
std::string link_preset_names();

}  // namespace tandem
