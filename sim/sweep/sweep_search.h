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
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sim/sweep/sweep_file.h"

namespace tandem {

// What a run's SLO verdict reads: every request of the run. A request that failed or was cancelled
// counts as a miss of every term (an infinitely late request), so a configuration cannot pass by
// failing the requests it cannot serve: the denominator is always the run's `total`.
struct RunSloFigures {
  int64_t total = 0, finished = 0, failed = 0, cancelled = 0;
  // Failed for a reason no arrival rate changes (a prompt over max_model_len, the token budget or
  // the whole KV cache, ...): the same requests fail at every rate.
  int64_t failed_at_any_rate = 0;
  std::map<std::string, int64_t> failed_by_reason;
  // p99 over all requests (nearest rank, as summary.json's), the unfinished counted as infinitely
  // late: +infinity when the rank falls among them; nullopt when no request has the figure (TPOT
  // needs two tokens). tpot_n: the requests it ranks (those with a TPOT, and the unfinished).
  std::optional<double> ttft_p99_ms, tpot_p99_ms;
  int64_t tpot_n = 0;
  // ITL is per token, and an unfinished request has no tokens to rank: the finished requests'
  // gaps' p99, and +infinity when more requests did not finish than a p99 over requests allows.
  std::optional<double> itl_p99_ms;
  double goodput_fraction = 0;  // requests within the workload's slo: section, over all requests
  int64_t unfinished() const { return total - finished; }
};

// The nearest rank of the p-th percentile of n values (1-based): ceil(p/100 * n), at least 1.
int64_t nearest_rank(double p, int64_t n);
// The p99 of `finished` values over `n` requests, n - finished of them unfinished (infinite).
std::optional<double> p99_over_all(std::vector<double> finished, int64_t n);

// Whether a run meets the SLO; `why` names the first term missed ("tpot_p99_ms 12.3 > 10", or
// how many requests did not finish when they decide it).
struct SloVerdict {
  bool ok = false;
  std::string why;
};
SloVerdict meets_slo(const SweepSlo& slo, const RunSloFigures& f);
// Whether the requests that fail at any rate alone break a term of the SLO (then no rate meets it);
// `why` says so with their count and reasons.
bool misses_at_any_rate(const SweepSlo& slo, const RunSloFigures& f, std::string* why);

class CapacitySearch {
 public:
  explicit CapacitySearch(const CapacitySpec& spec) : spec_(spec) {}
  // The rates to run next (empty: done). Each must be record()ed before the next call.
  std::vector<double> next() const;
  // at_any_rate: the run missed because of requests that fail at every rate (misses_at_any_rate).
  void record(double rate, bool ok, bool at_any_rate = false);
  bool done() const { return next().empty(); }

    // CannotFinish: requests that fail at every rate break the SLO, so no rate meets it (not a number).
  enum class Status { Found, BelowLo, AtLeastHi, CannotFinish };
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
    bool at_any_rate;
  };
  std::vector<Run> runs_;
};

}  // namespace tandem
