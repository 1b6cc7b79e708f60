// Hugging Face-style checkpoint folders: config.json plus one or more *.safetensors shards.
// Tensors are read converted to fp32 (the CPU backend computes in fp32 whatever the stored
// dtype). Every problem with the input throws tandem::InputError (core/error.h) naming the
// file and, where there is one, the tensor.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backend/specs.h"

namespace tandem {

struct TensorF32 {
  std::vector<int64_t> shape;
  std::vector<float> data;  // row-major, numel(shape) values
};

// The fields of HF LlamaConfig the backend needs.
struct HfLlamaConfig {
  int32_t hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0, num_attention_heads = 0,
          num_key_value_heads = 0, vocab_size = 0;
  int32_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-5, rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  std::string torch_dtype;  // informational
};

// Copies the shape fields of a checkpoint's config into a model spec (layers, hidden, heads,
// KV heads, ffn, vocab, RoPE theta, RMSNorm eps, tied embeddings); max_model_len is capped
// at max_position_embeddings.
void apply_hf_config(const HfLlamaConfig& c, ModelSpec& m);

class Checkpoint {
 public:
  // Reads config.json and indexes every *.safetensors file in the folder (headers only; tensor
  // data is read on demand). A model.safetensors.index.json is not needed: all shards are
  // indexed, and a tensor name present in two shards is an error.
  explicit Checkpoint(const std::string& folder);

  const HfLlamaConfig& config() const { return config_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // The tensor as fp32 (stored as F32, BF16 or F16). A non-empty expected_shape must match.
  TensorF32 read(const std::string& name, const std::vector<int64_t>& expected_shape = {}) const;
  std::vector<std::string> names() const;  // sorted

 private:
  struct Entry {
    std::string file, dtype;
    std::vector<int64_t> shape;
    uint64_t offset = 0, nbytes = 0;  // absolute position in the file
  };
  void index_file(const std::string& path);

  std::string folder_;
  HfLlamaConfig config_;
  std::map<std::string, Entry> tensors_;
};

// Writes one .safetensors file with the tensors in the given order. dtype is "F32", "BF16"
// (round to nearest even) or "F16" (IEEE half, round to nearest even, overflow to inf).
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorF32>>& tensors,
                       const std::string& dtype);
// Writes FOLDER/config.json in the HF LlamaConfig layout.
void write_hf_config(const std::string& folder, const HfLlamaConfig& c);

// fp32 <-> 16-bit conversions (exposed for tests and for the backend's own use).
uint16_t f32_to_bf16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

}  // namespace tandem
