// `tandem compare`'s summary reader: the input is run A's summary.json, compared with itself
// and with a fixed, valid run B in both orders. compare_runs must return 0, or 2 for an
// unusable summary (it reports InputError itself); nothing may escape it.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>

#include "sim/commands/compare.h"
#include "tests/fuzz/fuzz_common.h"

namespace {
const char* kValidSummary = R"({"backend": "sim", "policy": "continuous", "requests": {"finished": 10, "failed": 0,
  "cancelled": 0}, "ttft_ms": {"mean": 12.5, "p50": 10, "p90": 20, "p99": 30, "max": 31, "std": 4},
  "tpot_ms": {"mean": 0, "p50": 0}, "throughput": {"requests_per_s": 3.5}, "steps": 100, "makespan_s": 2.5})";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string a = tandem_fuzz::scratch_path("a"), b = tandem_fuzz::scratch_path("b");
  static const bool ready = (tandem_fuzz::write_file(b + "/summary.json", kValidSummary), true);
  (void)ready;
  tandem_fuzz::write_file(a + "/summary.json", data, size);
  std::ostringstream out, err;
  struct Quiet {  // compare_runs reports bad input on stderr: keep the fuzzer's log readable
    std::streambuf* saved;
    ~Quiet() { std::cerr.rdbuf(saved); }
  } quiet{std::cerr.rdbuf(err.rdbuf())};
  const int rc[3] = {tandem::compare_runs(a, a, out), tandem::compare_runs(a, b, out), tandem::compare_runs(b, a, out)};
  for (int r : rc)
    if (r != 0 && r != 2) {
      std::fprintf(stderr, "FINDING: compare_runs returned %d\n", r);
      std::abort();
    }
  return 0;
}
