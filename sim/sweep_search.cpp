#include "sim/sweep_search.h"

#include <fmt/format.h>

#include "core/json_strict.h"

#include <algorithm>
#include <cmath>

namespace tandem {

SloVerdict meets_slo(const SweepSlo& slo, const nlohmann::json& s) {
  const nlohmann::json* finished = json_at_path(s, "requests.finished");
  if (!finished || finished->get<int64_t>() == 0) return {false, "no request finished"};
  const auto check = [&](const std::optional<double>& limit, const char* path, const char* name) -> std::string {
    if (!limit) return "";
    const nlohmann::json* v = json_at_path(s, path);
    // A metric with no sample (no request decoded twice: no TPOT) cannot miss the SLO.
    if (!v || !v->is_number()) return "";
    const double x = v->get<double>();
    return x > *limit ? fmt::format("{} {:.4g} > {:.4g}", name, x, *limit) : "";
  };
  for (const std::string& why :
       {check(slo.ttft_p99_ms, "ttft_ms.p99", "ttft_p99_ms"), check(slo.tpot_p99_ms, "tpot_ms.p99", "tpot_p99_ms"),
        check(slo.itl_p99_ms, "itl_ms.p99", "itl_p99_ms")})
    if (!why.empty()) return {false, why};
  if (slo.goodput_min) {
    const nlohmann::json* g = json_at_path(s, "goodput.fraction");
    const double x = g && g->is_number() ? g->get<double>() : 0;
    if (x < *slo.goodput_min) return {false, fmt::format("goodput {:.4g} < {:.4g}", x, *slo.goodput_min)};
  }
  return {true, ""};
}

bool CapacitySearch::known(double rate, bool* ok) const {
  for (const Run& r : runs_)
    if (r.rate == rate) {
      *ok = r.ok;
      return true;
    }
  return false;
}

void CapacitySearch::bracket(double& good, double& bad) const {
  good = 0, bad = 0;
  for (const Run& r : runs_)
    if (!r.ok && (bad == 0 || r.rate < bad)) bad = r.rate;
  for (const Run& r : runs_)
    if (r.ok && (bad == 0 || r.rate < bad)) good = std::max(good, r.rate);
}

std::vector<double> CapacitySearch::next() const {
  bool lo_ok = false, hi_ok = false;
  const bool lo_known = known(spec_.lo, &lo_ok), hi_known = known(spec_.hi, &hi_ok);
  if (!lo_known || !hi_known) {  // the first round: both ends at once
    std::vector<double> r;
    if (!lo_known) r.push_back(spec_.lo);
    if (!hi_known) r.push_back(spec_.hi);
    return r;
  }
  if (!lo_ok || hi_ok) return {};  // below lo, or at least hi: nothing to bisect
  double good = 0, bad = 0;
  bracket(good, bad);
  if (good == 0 || bad == 0 || bad <= good * (1 + spec_.tolerance)) return {};  // narrow enough
  std::vector<double> r;
  const double span = std::log(bad / good);
  for (int32_t k = 1; k <= spec_.probes; ++k) r.push_back(good * std::exp(span * k / (spec_.probes + 1)));
  return r;
}

void CapacitySearch::record(double rate, bool ok) { runs_.push_back({rate, ok}); }

CapacitySearch::Result CapacitySearch::result() const {
  Result r;
  r.runs = int32_t(runs_.size());
  bool lo_ok = false, hi_ok = false;
  const bool lo_known = known(spec_.lo, &lo_ok), hi_known = known(spec_.hi, &hi_ok);
  if (lo_known && !lo_ok) {
    r.status = Status::BelowLo;
    r.first_bad = spec_.lo;
  } else if (hi_known && hi_ok) {
    r.status = Status::AtLeastHi;
    r.capacity = spec_.hi;
  } else {
    bracket(r.capacity, r.first_bad);
  }
  return r;
}

const char* CapacitySearch::status_name(Status s) {
  switch (s) {
    case Status::Found: return "found";
    case Status::BelowLo: return "below_lo";
    case Status::AtLeastHi: return "at_least_hi";
  }
  return "?";
}

}  // namespace tandem
