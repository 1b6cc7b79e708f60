// Model and hardware descriptions, shared by the cost models and (later) the real backends.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace tandem {

struct ModelSpec {
  std::string name;          // preset name, or "custom"
  int32_t layers = 0;
  int32_t hidden = 0;
  int32_t heads = 0;
  int32_t kv_heads = 0;
  int32_t ffn = 0;           // SwiGLU intermediate size
  int32_t vocab = 0;
  std::string dtype = "bf16";
  int32_t max_model_len = 0;

  int32_t head_dim() const { return hidden / heads; }
  int32_t dtype_bytes() const;
  // Parameters of the linear layers of all decoder layers (q, k, v, o, gate, up, down).
  double linear_params() const;
  // Embedding + LM head (untied, as in Llama 3).
  double embedding_params() const { return 2.0 * hidden * vocab; }
  double params() const { return linear_params() + embedding_params(); }
  double weight_bytes() const { return params() * dtype_bytes(); }
  // K and V of one token, all layers.
  double kv_bytes_per_token() const { return 2.0 * layers * kv_heads * head_dim() * dtype_bytes(); }
};

struct HardwareSpec {
  std::string name;
  double peak_flops = 0;          // dense matrix FLOP/s at the model dtype
  double mem_bandwidth = 0;       // bytes/s
  double step_overhead_s = 0;     // fixed cost of every step (launches, scheduling, sampling)
  double memory_bytes = 0;        // device memory, to size the KV cache when not given
  std::string source;             // where the numbers come from (datasheet / measured / assumed)
};

// Named presets. Return nullopt for an unknown name.
std::optional<ModelSpec> model_preset(const std::string& name);
std::optional<HardwareSpec> hardware_preset(const std::string& name);
std::string model_preset_names();
std::string hardware_preset_names();

}  // namespace tandem
