// Tiny Llama shapes for the backend tests (CPU and CUDA), so a test names only what it varies.
#pragma once
#include <cstdint>

#include "backend/specs.h"

namespace tandem::testing {

struct SmallModelShape {
  int32_t heads = 5;
  int32_t kv_heads = 1;
  int32_t hidden = 200;
  int32_t ffn = 340;
  const char* dtype = "fp32";
};

// "test": 2 layers, vocab 997, max_model_len 1024. The default shape has odd sizes on purpose:
// K tails (hidden 200 = 25 x 8; ffn 340 = 42 x 8 + 4) and ragged N.
inline ModelSpec small_model(const SmallModelShape& s = {}) {
  ModelSpec m;
  m.name = "test";
  m.layers = 2;
  m.hidden = s.hidden;
  m.heads = s.heads;
  m.kv_heads = s.kv_heads;
  m.ffn = s.ffn;
  m.vocab = 997;
  m.dtype = s.dtype;
  m.max_model_len = 1024;
  return m;
}

}  // namespace tandem::testing
