// Metrics (sim/metrics): SLO attainment on a hand-made requests table, against counts done by hand.
#include <doctest/doctest.h>

#include <vector>

#include "sim/engine/metrics.h"

using namespace tandem;

namespace {
constexpr Time kMs = 1'000'000;

// A finished request that arrived at 0: its first token at `ttft` ms, then `gap` ms between tokens.
Request finished(ReqId id, int32_t output, int64_t ttft, int64_t gap) {
  Request r;
  r.id = id;
  r.prompt_len = 10;
  r.max_output = output;
  r.generated = output;
  r.status = RequestStatus::Finished;
  r.first_scheduled = 0;
  r.first_token = ttft * kMs;
  r.last_token = r.first_token + (output - 1) * gap * kMs;
  r.finish = r.last_token;
  return r;
}

// Bounds: TTFT <= 100 ms, TPOT <= 10 ms. The table, request by request:
//   0  TTFT 50, TPOT 8          both met
//   1  TTFT 150, TPOT 5         TTFT missed
//   2  TTFT 80, TPOT 20         TPOT missed
//   3  TTFT 90, one token       no TPOT: meets the TPOT bound
//   4  TTFT 100, TPOT 10        on both bounds: met (<=)
//   5  failed at arrival        a miss
//   6  cancelled after 2 tokens (TTFT 10, TPOT 2)  a miss, however fast
// TTFT met: 0, 2, 3, 4 = 4 of 7; TPOT met: 0, 1, 3, 4 = 4 of 7; both: 0, 3, 4 = 3 of 7.
std::vector<Request> table() {
  std::vector<Request> t = {finished(0, 10, 50, 8), finished(1, 5, 150, 5), finished(2, 3, 80, 20),
                            finished(3, 1, 90, 0), finished(4, 3, 100, 10)};
  Request failed;
  failed.id = 5;
  failed.prompt_len = 10;
  failed.max_output = 4;
  failed.status = RequestStatus::Failed;
  failed.fail_reason = FailReason::ExceedsKvCapacity;
  failed.finish = 0;
  t.push_back(failed);
  Request cancelled = finished(6, 2, 10, 2);
  cancelled.max_output = 8;
  cancelled.status = RequestStatus::Cancelled;
  t.push_back(cancelled);
  return t;
}
}  // namespace

TEST_CASE("attainment: over all requests, failed and cancelled ones misses; TPOT = (last - first) / (output - 1)") {
  const std::vector<Request> t = table();
  const Attainment a = slo_attainment(t, SloSpec{.ttft_ms = 100, .tpot_ms = 10});
  CHECK(a.requests == 7);
  CHECK(a.not_finished == 2);
  CHECK(a.has_ttft);
  CHECK(a.has_tpot);
  CHECK(a.ttft_met == 4);
  CHECK(a.tpot_met == 4);
  CHECK(a.both_met == 3);
  CHECK(a.ttft == doctest::Approx(4.0 / 7));
  CHECK(a.tpot == doctest::Approx(4.0 / 7));
  CHECK(a.both == doctest::Approx(3.0 / 7));
}

TEST_CASE("attainment: a bound the workload does not set has none; both is the bounds that are set") {
  const std::vector<Request> t = table();
  const Attainment ttft_only = slo_attainment(t, SloSpec{.ttft_ms = 100, .tpot_ms = 0});
  CHECK_FALSE(ttft_only.has_tpot);
  CHECK(ttft_only.tpot_met == 0);
  CHECK(ttft_only.both_met == 4);  // requests 0, 2, 3, 4
  const Attainment tpot_only = slo_attainment(t, SloSpec{.ttft_ms = 0, .tpot_ms = 10});
  CHECK_FALSE(tpot_only.has_ttft);
  CHECK(tpot_only.both_met == 4);  // requests 0, 1, 3, 4
  CHECK(tpot_only.both == doctest::Approx(4.0 / 7));
  const Attainment none = slo_attainment({}, SloSpec{.ttft_ms = 100, .tpot_ms = 10});
  CHECK(none.requests == 0);
  CHECK(none.both == 0);
}

TEST_CASE("attainment in the summary divides by all requests; goodput.fraction by the finished ones") {
  const std::vector<Request> t = table();
  Workload w;
  w.slo = {.ttft_ms = 100, .tpot_ms = 10};
  const Summary s = MetricsRecorder().summarize(t, w, {});
  REQUIRE(s.has_slo);
  CHECK(s.finished == 5);
  CHECK(s.failed == 1);
  CHECK(s.cancelled == 1);
  CHECK(s.goodput_fraction == doctest::Approx(3.0 / 5));  // of finished
  CHECK(s.attainment.both == doctest::Approx(3.0 / 7));   // of all
  CHECK(s.attainment.ttft == doctest::Approx(4.0 / 7));
  CHECK(s.attainment.tpot == doctest::Approx(4.0 / 7));
  // Without an SLO there is no attainment to report.
  const Summary plain = MetricsRecorder().summarize(t, Workload{}, {});
  CHECK_FALSE(plain.has_slo);
  CHECK(plain.attainment.requests == 0);
}
