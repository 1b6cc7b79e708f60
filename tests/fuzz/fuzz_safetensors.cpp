// The safetensors reader: the input is a checkpoint's only shard (model.safetensors, beside a
// valid config.json). Indexing must succeed or throw InputError, and so must reading each
// tensor it indexed (sizes and offsets come from the untrusted header).
#include <string>

#include "backend/cpu/checkpoint.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    const std::string d = tandem_fuzz::scratch_path("ckpt");
    tandem::HfLlamaConfig c;
    c.hidden_size = 8;
    c.intermediate_size = 16;
    c.num_hidden_layers = 1;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    c.vocab_size = 16;
    c.max_position_embeddings = 64;
    std::filesystem::create_directories(d);
    tandem::write_hf_config(d, c);
    return d;
  }();
  tandem_fuzz::write_file(dir + "/model.safetensors", data, size);
  try {
    const tandem::Checkpoint ck(dir);
    for (const std::string& name : ck.names()) {
      TANDEM_FUZZ_EXPECT_INPUT_ERROR((void)ck.read(name));
      TANDEM_FUZZ_EXPECT_INPUT_ERROR((void)ck.read(name, {2, 2}));
    }
  } catch (const tandem::InputError&) {}
  return 0;
}
