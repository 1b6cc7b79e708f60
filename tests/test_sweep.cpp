// The sweep's capacity search and SLO check (sim/sweep_search.h) against thresholds known in
// advance; the whole command is tested on real runs in tests/sweep_test.sh.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>

#include "core/utf8.h"
#include "sim/sweep_search.h"

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
  const nlohmann::json s = {{"requests", {{"finished", 10}}},
                            {"ttft_ms", {{"p99", 900.0}}},
                            {"tpot_ms", {{"p99", 12.0}}},
                            {"itl_ms", {{"p99", 30.0}}},
                            {"goodput", {{"fraction", 0.8}}}};
  SweepSlo slo;
  slo.ttft_p99_ms = 1000;
  CHECK(meets_slo(slo, s).ok);
  slo.tpot_p99_ms = 10;
  auto v = meets_slo(slo, s);
  CHECK_FALSE(v.ok);
  CHECK(v.why == "tpot_p99_ms 12 > 10");
  slo.tpot_p99_ms.reset();
  slo.goodput_min = 0.9;
  v = meets_slo(slo, s);
  CHECK_FALSE(v.ok);
  CHECK(v.why.starts_with("goodput 0.8 < 0.9"));
  slo.goodput_min = 0.8;
  CHECK(meets_slo(slo, s).ok);
  nlohmann::json none = s;
  none["requests"]["finished"] = 0;
  CHECK(meets_slo(slo, none).why == "no request finished");
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
