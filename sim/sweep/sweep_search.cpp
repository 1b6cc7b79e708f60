#include "sim/sweep/sweep_search.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace tandem {

int64_t nearest_rank(double p, int64_t n) {
  return std::max<int64_t>(1, int64_t(std::ceil(p / 100.0 * double(n))));
}

std::optional<double> p99_over_all(std::vector<double> finished, int64_t n) {
  if (n <= 0) return std::nullopt;
  const int64_t rank = nearest_rank(99, n);
  if (rank > int64_t(finished.size())) return std::numeric_limits<double>::infinity();
  std::nth_element(finished.begin(), finished.begin() + (rank - 1), finished.end());
  return finished[size_t(rank - 1)];
}

namespace {
std::string unfinished_text(const RunSloFigures& f) {
  return fmt::format("{} did not finish ({} failed, {} cancelled)", f.unfinished(), f.failed, f.cancelled);
}
}  // namespace

SloVerdict meets_slo(const SweepSlo& slo, const RunSloFigures& f) {
  if (f.finished == 0) return {false, fmt::format("no request of {} finished", f.total)};
  const auto check = [&](const std::optional<double>& limit, const std::optional<double>& v,
                         const char* name) -> std::string {
    // A figure with no sample (no request decoded twice: no TPOT) cannot miss the SLO.
    if (!limit || !v) return "";
    if (std::isinf(*v))
      return fmt::format("{} over all {} requests > {:.4g}: {}", name, f.total, *limit, unfinished_text(f));
    return *v > *limit ? fmt::format("{} {:.4g} > {:.4g}", name, *v, *limit) : "";
  };
  for (const std::string& why : {check(slo.ttft_p99_ms, f.ttft_p99_ms, "ttft_p99_ms"),
                                 check(slo.tpot_p99_ms, f.tpot_p99_ms, "tpot_p99_ms"),
                                 check(slo.itl_p99_ms, f.itl_p99_ms, "itl_p99_ms")})
    if (!why.empty()) return {false, why};
  if (slo.goodput_min && f.goodput_fraction < *slo.goodput_min)
    return {false, fmt::format("goodput {:.4g} < {:.4g} over all {} requests{}", f.goodput_fraction, *slo.goodput_min,
                               f.total, f.unfinished() ? "; " + unfinished_text(f) : "")};
  return {true, ""};
}

bool misses_at_any_rate(const SweepSlo& slo, const RunSloFigures& f, std::string* why) {
  const int64_t never = f.failed_at_any_rate;
  if (never == 0 || f.total == 0) return false;
  // As if every other request met every term: the terms still missed are missed at every rate.
  const auto breaks_p99 = [&](int64_t n) { return n > 0 && nearest_rank(99, n) > n - never; };
  const bool miss = ((slo.ttft_p99_ms || slo.itl_p99_ms) && breaks_p99(f.total)) ||
                    (slo.tpot_p99_ms && breaks_p99(f.tpot_n)) ||
                    (slo.goodput_min && double(f.total - never) / double(f.total) < *slo.goodput_min);
  if (!miss) return false;
  if (why) {
    std::string reasons;
    for (const auto& [reason, n] : f.failed_by_reason) reasons += fmt::format("{}{} {}", reasons.empty() ? "" : ", ", reason, n);
    *why = fmt::format("{} of {} requests fail at any rate ({})", never, f.total, reasons);
  }
  return true;
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

void CapacitySearch::record(double rate, bool ok, bool at_any_rate) { runs_.push_back({rate, ok, at_any_rate}); }

CapacitySearch::Result CapacitySearch::result() const {
  Result r;
  r.runs = int32_t(runs_.size());
  bool lo_ok = false, hi_ok = false;
  const bool lo_known = known(spec_.lo, &lo_ok), hi_known = known(spec_.hi, &hi_ok);
  const bool never = std::any_of(runs_.begin(), runs_.end(), [](const Run& x) { return x.at_any_rate; });
  if (never) {
    r.status = Status::CannotFinish;
    r.first_bad = spec_.lo;
  } else if (lo_known && !lo_ok) {
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
    case Status::CannotFinish: return "cannot_finish";
  }
  return "?";
}

}  // namespace tandem
