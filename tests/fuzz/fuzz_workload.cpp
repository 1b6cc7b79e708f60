// The workload loader with --set overrides: parse_workload(text, path, overrides).
// Input: a workload YAML; every line "#set KEY=VALUE" (a YAML comment, so the text stays a
// workload) is also passed as the override KEY=VALUE, in order. Relative paths resolve against
// the repository's workloads/ folder, as for a file there. A workload that loads must also
// print (tandem validate) and that output must load again.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "sim/workload/config.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::vector<tandem::Override> overrides = tandem_fuzz::set_lines(text);
  const std::string path = std::string(TANDEM_SOURCE_DIR) + "/workloads/fuzz-input.yaml";
  try {
    const tandem::Workload w = tandem::parse_workload(text, path, overrides);
    const std::string printed = tandem::to_yaml(w);
    try {
      (void)tandem::parse_workload(printed, path);
    } catch (const tandem::InputError& e) {
      std::fprintf(stderr,
                   "FINDING: the resolved workload (tandem validate) does not load again: %s\n--- printed:\n%s\n",
                   e.what(), printed.c_str());
      std::abort();
    }
  } catch (const tandem::InputError&) {}
  return 0;
}
