// A hardware profile file (what `tandem calibrate` writes, read when a workload names it:
// hardware: PROFILE.yaml; parse_hardware in sim/workload/config_model.cpp). The input is the profile;
// the workload around it is fixed (model tiny, as the seed profiles were fitted on). Loading
// must succeed or throw InputError, and a loaded workload must print.
#include <string>

#include "sim/workload/config.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string profile = tandem_fuzz::scratch_path("profile.yaml");
  static const std::string workload =
      "model: tiny\n"
      "hardware: " +
      profile +
      "\n"
      "engine: {max_num_seqs: 4, max_num_batched_tokens: 64}\n"
      "requests: {count: 2, prompt_len: 4, output_len: 4}\n";
  tandem_fuzz::write_file(profile, data, size);
  try {
    const tandem::Workload w = tandem::parse_workload(workload, tandem_fuzz::scratch_path("w.yaml"));
    (void)tandem::to_yaml(w);
  } catch (const tandem::InputError&) {}
  return 0;
}
