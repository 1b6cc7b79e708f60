// The capacity search of a sweep point: the highest arrival rate whose run meets the SLO.
// Geometric bisection of [lo, hi]: the tolerance is relative, so each run halves the bracket's
// log-width, and the runs it takes are 2 + ceil(log2(ln(hi/lo) / ln(1 + tolerance))) whatever
// the capacity (10 for 1..64 req/s at 2 %). With `probes` k > 1 a round runs k rates at once,
// splitting the bracket in k + 1 (for few points on many cores). The answer depends on k, never
// on the number of threads, so a sweep gives the same figures on a laptop and on a cluster.
// It assumes meeting the SLO is monotone in the rate; where noise makes it not, it returns one
// crossing, and every run is kept in the results to show it.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sim/sweep_spec.h"

namespace tandem {

// Whether a run's summary (summary.json's keys) meets the SLO; `why` names the first term missed
// ("tpot_p99_ms 12.3 > 10") or a run that finished no request.
struct SloVerdict {
  bool ok = false;
  std::string why;
};
SloVerdict meets_slo(const SweepSlo& slo, const nlohmann::json& summary);

class CapacitySearch {
 public:
  explicit CapacitySearch(const CapacitySpec& spec) : spec_(spec) {}
  // The rates to run next (empty: done). Each must be record()ed before the next call.
  std::vector<double> next() const;
  void record(double rate, bool ok);
  bool done() const { return next().empty(); }

  enum class Status { Found, BelowLo, AtLeastHi };
  struct Result {
    Status status = Status::Found;
    double capacity = 0;   // the highest rate that met the SLO (0: none)
    double first_bad = 0;  // the lowest rate above it that missed (0: none)
    int32_t runs = 0;
  };
  Result result() const;
  static const char* status_name(Status s);

 private:
  // The bracket from every run so far: bad, the lowest rate that missed; good, the highest rate
  // below it that met the SLO. Where noise makes meeting it not monotone this is the first
  // crossing from below: the conservative answer. 0 where not known.
  void bracket(double& good, double& bad) const;
  bool known(double rate, bool* ok) const;

  CapacitySpec spec_;
  struct Run {
    double rate;
    bool ok;
  };
  std::vector<Run> runs_;
};

}  // namespace tandem
