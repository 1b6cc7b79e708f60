// A checkpoint's config.json: read by Checkpoint (beside a valid, empty safetensors shard),
// then used as a workload's model (model: {checkpoint: DIR}), which derives the model shape,
// its sizes and the KV cache from it. Each step must succeed or throw InputError.
#include <string>

#include "backend/cpu/checkpoint.h"
#include "sim/workload/config.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    const std::string d = tandem_fuzz::scratch_path("ckpt");
    std::filesystem::create_directories(d);
    tandem::write_safetensors(d + "/model.safetensors", {}, "F32");
    return d;
  }();
  static const std::string workload = "model: {checkpoint: " + dir +
                                      "}\n"
                                      "hardware: h200\n"
                                      "engine: {max_num_seqs: 4, max_num_batched_tokens: 64}\n"
                                      "requests: {count: 2, prompt_len: 4, output_len: 4}\n";
  tandem_fuzz::write_file(dir + "/config.json", data, size);
  try {
    const tandem::Checkpoint ck(dir);
    tandem::ModelSpec m;
    tandem::apply_hf_config(ck.config(), m);
    const tandem::Workload w = tandem::parse_workload(workload, tandem_fuzz::scratch_path("w.yaml"));
    (void)tandem::to_yaml(w);
  } catch (const tandem::InputError&) {}
  return 0;
}
