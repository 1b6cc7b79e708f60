// One trace reader (azure, vidur or mooncake: TANDEM_FUZZ_TRACE_FORMAT, set by meson) over a
// file holding the input: read_trace() must return rows or throw InputError.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "sim/workload/traces.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = tandem_fuzz::scratch_path("trace.in");
  tandem_fuzz::write_file(path, data, size);
  tandem::TraceSpec t;
  t.format = tandem::TraceSpec::Format::TANDEM_FUZZ_TRACE_FORMAT;
  t.path = path;
  std::vector<int64_t> pool;
  try {
    const std::vector<tandem::TraceRow> rows = tandem::read_trace(t, pool);
    for (const auto& r : rows) {
      // The readers promise finite, non-negative offsets and lengths, and hash ranges inside the pool.
      if (!std::isfinite(r.t_s) || r.t_s < 0 || r.prompt_len < 0 || r.output_len < 0 ||
          uint64_t(r.hash_begin) + r.hash_count > pool.size()) {
        std::fprintf(stderr, "FINDING: bad row t=%g prompt=%lld output=%lld hashes [%u, +%u) of %zu\n", r.t_s,
                     (long long)r.prompt_len, (long long)r.output_len, r.hash_begin, r.hash_count, pool.size());
        std::abort();
      }
    }
  } catch (const tandem::InputError&) {}
  return 0;
}
