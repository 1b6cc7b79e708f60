// TEST ONLY: the faults a decode worker can inject (sim/worker/worker_server.cpp applies them).
#pragma once
#include <cstdint>
#include <set>
#include <string>

namespace tandem {

// TEST ONLY: faults a worker injects into the KV pushes it receives (`tandem worker
// --inject-transfer-faults SPEC`, or $TANDEM_WORKER_INJECT for the worker a run starts), as
// SGLang's DISAGGREGATION_TEST_FAILURE_PROB does. SPEC is comma-separated KEY=VALUE:
//   fail, corrupt, partial   a probability per push (drawn from `seed`), or @N[:N...]: those pushes
//                            (counted from 1 per connection). fail: answered Failed, nothing
//                            written; corrupt: a byte flipped after the frame's check; partial: half
//                            the blocks written, and the count says so
//   delay_ack_ms, delay_step_ms   hold every KvAck / every step this long (orderings for tests)
struct FaultInjection {
  double fail = 0, corrupt = 0, partial = 0;
  std::set<int64_t> fail_at, corrupt_at, partial_at;
  uint64_t seed = 0;
  int64_t delay_ack_ms = 0, delay_step_ms = 0;
  bool any() const;
};
FaultInjection parse_fault_injection(const std::string& spec);  // InputError naming the bad item
std::string describe(const FaultInjection& f);

}  // namespace tandem
