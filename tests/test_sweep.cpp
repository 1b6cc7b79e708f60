// The sweep's capacity search and SLO check (sim/sweep/sweep_search.h) against thresholds known in
// advance; the whole command is tested on real runs in tests/sweep_test.sh.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>

#include "core/utf8.h"
#include "sim/sweep/sweep_search.h"

using namespace tandem;

namespace {
// Runs a search against `meets` (the SLO as a function of the rate) and returns its result.
CapacitySearch::Result search(const CapacitySpec& spec, const std::function<bool(double)>& meets,
                              std::vector<double>* tried = nullptr) {
  CapacitySearch s(spec);
  for (int round = 0; round < 1000; ++round) {
    const std::vector<double> rates = s.next();
    if (rates.empty()) break;
    for (double r : rates) {
      if (tried) tried->push_back(r);
      s.record(r, meets(r));
    }
  }
  return s.result();
}
}  // namespace

TEST_CASE("capacity search: brackets a monotone threshold within the tolerance, in the predicted runs") {
  for (double cap : {1.3, 7.77, 12.0, 33.3, 63.9}) {
    CapacitySpec spec{.slo = {}, .lo = 1, .hi = 64, .tolerance = 0.02, .probes = 1};
    const auto r = search(spec, [&](double x) { return x <= cap; });
    CAPTURE(cap);
    CHECK(r.status == CapacitySearch::Status::Found);
    CHECK(r.capacity <= cap);
    CHECK(r.first_bad > cap);
    CHECK(r.first_bad <= r.capacity * 1.02);
    // 2 ends, then halvings of the log-width until within 2 %: ceil(log2(ln 64 / ln 1.02)) = 8.
    CHECK(r.runs == 2 + 8);
  }
}

TEST_CASE("capacity search: more probes per round, fewer rounds, same guarantee") {
  const double cap = 21.5;
  CapacitySpec spec{.slo = {}, .lo = 1, .hi = 64, .tolerance = 0.02, .probes = 3};
  CapacitySearch s(spec);
  int rounds = 0;
  while (!s.done()) {
    const auto rates = s.next();
    CHECK((rounds == 0 ? rates.size() == 2 : rates.size() == 3));
    for (double r : rates) s.record(r, r <= cap);
    ++rounds;
  }
  const auto r = s.result();
  CHECK(r.capacity <= cap);
  CHECK(r.first_bad > cap);
  CHECK(r.first_bad <= r.capacity * 1.02);
  CHECK(rounds == 1 + 4);  // each round divides the log-width by 4: 4^4 = 256 > ln 64 / ln 1.02 = 210
}

TEST_CASE("capacity search: below lo and at least hi end after one round") {
  CapacitySpec spec{.slo = {}, .lo = 2, .hi = 10, .tolerance = 0.05, .probes = 1};
  auto r = search(spec, [](double) { return false; });
  CHECK(r.status == CapacitySearch::Status::BelowLo);
  CHECK(r.capacity == 0);
  CHECK(r.runs == 2);
  r = search(spec, [](double) { return true; });
  CHECK(r.status == CapacitySearch::Status::AtLeastHi);
  CHECK(r.capacity == 10);
  CHECK(r.runs == 2);
}

TEST_CASE("capacity search: where meeting the SLO is not monotone, the first crossing from below") {
  // Meets below 5, misses in [5, 6), meets again in [6, 8), misses above: the answer stays below 5
  // whatever the probes hit, never in the second window.
  CapacitySpec spec{.slo = {}, .lo = 1, .hi = 64, .tolerance = 0.01, .probes = 2};
  std::vector<double> tried;
  const auto r = search(
      spec, [](double x) { return x < 5 || (x >= 6 && x < 8); }, &tried);
  CAPTURE(tried.size());
  CHECK(r.status == CapacitySearch::Status::Found);
  CHECK(r.capacity < 8);
  CHECK(r.first_bad <= r.capacity * 1.01);
}

TEST_CASE("meets_slo: each term, the first missed named; no finished request never meets") {
  RunSloFigures f;
  f.total = f.finished = 10;
  f.ttft_p99_ms = 900.0, f.tpot_p99_ms = 12.0, f.itl_p99_ms = 30.0, f.goodput_fraction = 0.8;
  SweepSlo slo;
  slo.ttft_p99_ms = 1000;
  CHECK(meets_slo(slo, f).ok);
  slo.tpot_p99_ms = 10;
  auto v = meets_slo(slo, f);
  CHECK_FALSE(v.ok);
  CHECK(v.why == "tpot_p99_ms 12 > 10");
  slo.tpot_p99_ms.reset();
  slo.goodput_min = 0.9;
  v = meets_slo(slo, f);
  CHECK_FALSE(v.ok);
  CHECK(v.why.starts_with("goodput 0.8 < 0.9 over all 10 requests"));
  slo.goodput_min = 0.8;
  CHECK(meets_slo(slo, f).ok);
  RunSloFigures none = f;
  none.finished = 0;
  CHECK(meets_slo(slo, none).why == "no request of 10 finished");
}

TEST_CASE("p99 over all requests: an unfinished request counts as a miss, the denominator is every request") {
  // 100 finished values 1..100: nearest rank 99 of 100 is 99.
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  CHECK(p99_over_all(v, 100) == 99.0);
  // One of 101 unfinished: rank ceil(99.99) = 100 of 101, still a finished one (100).
  CHECK(p99_over_all(v, 101) == 100.0);
  // Two of 102 unfinished: rank ceil(100.98) = 101 > 100 finished: infinite.
  CHECK(std::isinf(*p99_over_all(v, 102)));
  CHECK_FALSE(p99_over_all({}, 0).has_value());
}

TEST_CASE("meets_slo: requests that fail or are cancelled are misses, whatever the finished ones' latencies") {
  // The case: 338 of 500 finished, every finished one fast. Before, the run passed.
  std::vector<double> fast(338, 5.0);
  RunSloFigures f;
  f.total = 500, f.finished = 338, f.failed = 162, f.failed_at_any_rate = 162;
  f.failed_by_reason = {{"prompt_over_budget", 162}};
  f.ttft_p99_ms = p99_over_all(fast, f.total);
  f.tpot_p99_ms = p99_over_all(fast, 338 + 162), f.tpot_n = 500;
  f.goodput_fraction = 338.0 / 500;
  SweepSlo slo;
  slo.ttft_p99_ms = 1000;
  auto v = meets_slo(slo, f);
  CHECK_FALSE(v.ok);
  CHECK(v.why == "ttft_p99_ms over all 500 requests > 1000: 162 did not finish (162 failed, 0 cancelled)");
  std::string why;
  CHECK(misses_at_any_rate(slo, f, &why));
  CHECK(why == "162 of 500 requests fail at any rate (prompt_over_budget 162)");
  // goodput over all requests: 338/500 = 0.676.
  SweepSlo g;
  g.goodput_min = 0.6;
  CHECK(meets_slo(g, f).ok);
  CHECK_FALSE(misses_at_any_rate(g, f, nullptr));
  g.goodput_min = 0.7;
  CHECK_FALSE(meets_slo(g, f).ok);
  CHECK(misses_at_any_rate(g, f, nullptr));
  // Cancelled requests miss too, but a lower rate may cancel fewer: never "at any rate".
  RunSloFigures c = f;
  c.failed = 0, c.cancelled = 162, c.failed_at_any_rate = 0;
  CHECK_FALSE(meets_slo(slo, c).ok);
  CHECK_FALSE(misses_at_any_rate(slo, c, nullptr));
  // Within p99's allowance (5 of 500 unfinished, rank 495 of 495 finished): the run can pass.
  RunSloFigures few = f;
  few.finished = 495, few.failed = 5, few.failed_at_any_rate = 5;
  few.ttft_p99_ms = p99_over_all(std::vector<double>(495, 5.0), 500);
  CHECK(meets_slo(slo, few).ok);
  CHECK_FALSE(misses_at_any_rate(slo, few, nullptr));
}

TEST_CASE("capacity search: a miss at any rate ends the search as cannot_finish, not a number") {
  CapacitySpec spec{.slo = {}, .lo = 1, .hi = 64, .tolerance = 0.02, .probes = 1};
  CapacitySearch s(spec);
  const auto rates = s.next();
  REQUIRE(rates.size() == 2);
  for (double r : rates) s.record(r, false, true);
  CHECK(s.done());
  const auto r = s.result();
  CHECK(r.status == CapacitySearch::Status::CannotFinish);
  CHECK(r.capacity == 0);
  CHECK(std::string(CapacitySearch::status_name(r.status)) == "cannot_finish");
}

TEST_CASE("first_invalid_utf8: where text stops being UTF-8 (sweep files and plans hold UTF-8 only)") {
  using std::string_view;
  CHECK(first_invalid_utf8("plain ascii") == string_view::npos);
  CHECK(first_invalid_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80") == string_view::npos);  // é € 😀
  CHECK(first_invalid_utf8("ab\x94") == 2);              // a lone continuation byte
  CHECK(first_invalid_utf8("caf\xe9!") == 3);            // Latin-1, not UTF-8
  CHECK(first_invalid_utf8("x\xc3") == 1);               // cut short
  CHECK(first_invalid_utf8("\xc0\xaf") == 0);            // overlong '/'
  CHECK(first_invalid_utf8("\xed\xa0\x80") == 0);        // a surrogate
  CHECK(first_invalid_utf8("\xf4\x90\x80\x80") == 0);    // past U+10FFFF
}
