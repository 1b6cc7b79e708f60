// The KV store of an executor whose model keeps its KV cache as whole blocks (the CPU backend's
// LlamaModel, the CUDA backend's CudaModel): the blocks move through the model, by the same four
// calls on either. An executor derives from ModelKvStore<ItsModel> and says what its blocks are
// laid out as (kv_layout), which differs between the backends.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

#include "backend/executor.h"

namespace tandem {

template <class Model>
class ModelKvStore : public kv_store_i {
 public:
  // `model` may still be under construction (a member of the derived executor): it is only
  // used once the executor is built.
  explicit ModelKvStore(Model& model) : kv_model_(model) {}
  int64_t block_bytes() const override { return kv_model_.kv_block_bytes(); }
  int32_t num_blocks() const override { return kv_model_.kv_num_blocks(); }
  void read_blocks(std::span<const int32_t> blocks, std::span<std::byte> out) override {
    kv_model_.read_kv_blocks(blocks, out);
  }
  void write_blocks(std::span<const int32_t> blocks, std::span<const std::byte> in) override {
    kv_model_.write_kv_blocks(blocks, in);
  }

 private:
  Model& kv_model_;
};

}  // namespace tandem
