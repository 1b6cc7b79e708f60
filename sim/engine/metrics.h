// Latency and throughput metrics of a run. Per-request values (TTFT, TPOT, E2E) are exact;
// inter-token latencies go to a log-bucketed histogram (relative error <= 0.4%), so a run
// of a million requests needs no per-token storage.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/request.h"
#include "sim/workload/config.h"
#include "sim/base/host_probe.h"

namespace tandem {

// A request's TTFT and TPOT as every figure counts them (summary, attainment, the sweep's SLO
// verdict): TTFT = first token - arrival; TPOT = (last token - first token) / (output - 1), 0 for
// a one-token output (no gap to average).
inline double ttft_ms(const Request& r) { return to_ms(r.first_token - r.arrival); }
inline double tpot_ms(const Request& r) {
  return r.generated > 1 ? to_ms(r.last_token - r.first_token) / (r.generated - 1) : 0.0;
}

struct Percentiles {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
  double stddev = 0;  // population standard deviation
  int64_t n = 0;
};

// Nearest-rank percentiles (value at rank ceil(p/100 * n)); sorts `v` in place.
Percentiles percentiles(std::vector<double>& v);

class LogHistogram {
 public:
  void add(int64_t v);
  int64_t count() const { return count_; }
  double mean() const { return count_ ? sum_ / double(count_) : 0.0; }
  // Exact, not bucketed: kept beside the buckets.
  int64_t max() const { return max_; }
  double stddev() const;
  // Nearest-rank percentile; returns the bucket's midpoint.
  double percentile(double p) const;
  // Non-empty buckets as (lower bound, upper bound, count), for plots.
  struct Bucket {
    int64_t lo, hi, count;
  };
  std::vector<Bucket> buckets() const;

 private:
  static constexpr int kSub = 256;  // sub-buckets per power of two
  static size_t bucket(int64_t v);
  static double midpoint(size_t b);
  std::vector<int64_t> counts_ = std::vector<int64_t>(64 * kSub, 0);
  int64_t count_ = 0;
  double sum_ = 0;
  double sum_sq_ = 0;
  int64_t max_ = 0;
};

// Per instance (one for colocated serving; data_parallel replicas; or prefill + decode).
struct InstanceFigures {
  int32_t id = 0;
  std::string role;
  int64_t kv_blocks = 0, steps = 0;
  double kv_mean_util = 0, kv_peak_util = 0;  // over its own busy time and its own pool
  double busy_s = 0;                          // time in steps
  double busy_fraction = 0;                   // busy_s / the run's makespan
  double model_flops = 0;                     // its steps' model FLOPs (step_flops)
  std::optional<double> mfu;                  // model_flops / (makespan x its GPUs x peak); none: unknown
};

// The run's model FLOPs against what its GPUs could do over the makespan (summary.json's
// `utilisation`). peak_flops_per_gpu: the GPUs' mean peak (one figure where all are alike); none
// where an instance's peak is unknown (no GPU: the CPU backend; a fitted or profiled hardware),
// and then no mfu either.
struct Utilisation {
  double model_flops = 0;
  int32_t gpus = 0;
  std::optional<double> peak_flops_per_gpu, mfu;
};

// Where a run served its requests: the record every output carries (summary.json `layout`, the
// stdout header, `tandem compare`'s header), so that two runs on different hardware are never
// compared as if on the same.
struct InstanceLayout {
  int32_t id = 0;
  std::string role;        // colocated, prefill, decode
  std::string backend;     // its executor: sim, cpu, cuda; BACKEND@HOST:PORT for a decode worker
  int32_t tp = 1;          // ranks its model is split over
  int32_t gpus = 0;        // GPUs it computes on: tp on sim (simulated GPUs of `hardware`) and cuda, 0 on cpu
  int32_t first_gpu = -1;  // cuda: the first device of its tp; -1 elsewhere
  int64_t kv_blocks = 0;
};
struct RunLayout {
  std::vector<InstanceLayout> instances;
  int32_t data_parallel = 1;
  bool disaggregation = false;
  std::string channel;  // the KV channel between prefill and decode (sim, copy, tcp, nccl, ...); empty: none
  // Where the token that TTFT counts comes from: "colocated" (the instance that computed the prompt,
  // the only one), or in 1P1D "prefill" (P's sample, streamed at once) or "decode" (streamed by D
  // when the KV has arrived); see FirstTokenFrom.
  std::string first_token_from = "colocated";
  int32_t num_ranks() const;  // sum of TP over the instances
  // GPUs the run holds: sim, the ranks (each instance on tp simulated GPUs of its own); cuda, the
  // distinct devices (replicas may share one); cpu, none (its ranks are threads of this host).
  int32_t num_gpus() const;
};

// Stage 4 (1P1D). ttft_ms counts the client's first token (RunLayout::first_token_from: P's sample
// by default); ttft_after_transfer_ms is when the decode instance holds the request, the first
// token's time when D streams it (first_token_from: decode makes the two equal).
struct DisaggregationFigures {
  bool enabled = false;
  std::string channel;
  int64_t started = 0, delivered = 0, failed = 0, aborted = 0, stale = 0, cancelled_parked = 0;
  int64_t lost = 0;  // in flight when the run ended early (a lost decode worker): started = the rest + lost
  // failed = failed_error + failed_corrupt + failed_partial (each failed its request alone);
  // timed_out: transfers with no answer in channel.timeout_ms (they ended the run, among `lost`).
  int64_t failed_error = 0, failed_corrupt = 0, failed_partial = 0, timed_out = 0;
  // Cancels by the phase they found the request in (parked: cancelled_parked); received = on
  // the decode instance before its first step there.
  int64_t cancelled_prefill = 0, cancelled_transfer = 0, cancelled_received = 0, cancelled_decode = 0;
  int64_t bytes = 0;
  Percentiles transfer_ms;             // start -> end, per ended transfer (delivered or failed)
  Percentiles handoff_wait_ms;         // first token -> transfer start (waiting for a seat on D)
  Percentiles ttft_after_transfer_ms;  // arrival -> transfer end, finished requests
};

// SLO attainment as DistServe- and Splitwise-style figures define it: the share of ALL the
// workload's requests that met a bound. A request that failed, was cancelled or had not finished
// when the run ended counts as a miss (goodput.fraction divides by finished requests instead).
// TTFT = first token - arrival; TPOT = (last token - first token) / (output tokens - 1), so a
// request with one output token has no TPOT and meets any TPOT bound. A bound the workload does
// not set (slo.ttft_ms or slo.tpot_ms absent) has no attainment; `both` is every bound set.
struct Attainment {
  int64_t requests = 0;      // the denominator: every request of the workload
  int64_t not_finished = 0;  // failed, cancelled or unfinished: misses whatever the bounds
  bool has_ttft = false, has_tpot = false;
  double slo_ttft_ms = 0, slo_tpot_ms = 0;
  int64_t ttft_met = 0, tpot_met = 0, both_met = 0;
  double ttft = 0, tpot = 0, both = 0;  // met / requests (0 without requests)
};
Attainment slo_attainment(std::span<const Request> reqs, const SloSpec& slo);

struct Summary {
  std::string workload, policy, backend;
  Percentiles ttft_ms, tpot_ms, itl_ms, e2e_ms, queue_ms;
  std::vector<LogHistogram::Bucket> itl_histogram_ns;
  double requests_per_s = 0, output_tokens_per_s = 0, total_tokens_per_s = 0;
  // The load: configured_rate, requests.arrival.rate (0: a trace or bursts, which have none);
  // offered_rate, all requests over the time from the run's start to the last arrival (vLLM's
  // count / rate); equal with requests.arrival.normalize.
  double configured_rate = 0, offered_rate = 0;
  bool arrival_normalized = false;
  int64_t total = 0, finished = 0, failed = 0, cancelled = 0;
  std::map<std::string, int64_t> failed_by_reason;
  double jitter_ms = 0;  // mean over requests of the standard deviation of their ITLs
  // Steps that carried at least one decode, and of those the ones that also carried prefill
  // tokens (a whole prompt or a chunk): the decodes that waited for a prefill.
  int64_t decode_steps = 0, decode_steps_with_prefill = 0;
  double decode_steps_with_prefill_share = 0;
  // Prefix cache (stage 3): one query per admitted request; hit rate by prompt tokens and by
  // full prompt blocks; evictions = cached blocks whose hash was dropped to make room.
  bool prefix_enabled = false;
  double prefix_hit_rate = 0, prefix_block_hit_rate = 0;
  int64_t prefix_queries = 0, prefix_hits = 0;
  int64_t prefix_hit_tokens = 0, prefix_queried_tokens = 0, prefix_hit_blocks = 0, prefix_queried_blocks = 0;
  int64_t prefix_evictions = 0;
  // One instance: time-weighted mean and peak of its blocks in use. Several: not one figure
  // (each instance's pool is its own: `instances`); kv_blocks is then their sum.
  double kv_mean_util = 0, kv_peak_util = 0;
  int64_t kv_blocks = 0;
  bool has_slo = false;
  double slo_ttft_ms = 0, slo_tpot_ms = 0;
  double goodput_requests_per_s = 0, goodput_fraction = 0;  // fraction: of finished requests
  Attainment attainment;                                     // over all requests (has_slo only)
  int64_t steps = 0;
  double sim_s = 0, wall_s = 0, makespan_s = 0;
  int64_t peak_rss_kb = 0;
  std::string prefix_off_reason;  // why prefix caching is off, when a rule turned it off
  RunLayout layout;
  std::vector<InstanceFigures> instances;  // one per instance
  Utilisation utilisation;
  DisaggregationFigures disaggregation;
  // Set when the run ended early at run time (a decode worker lost): every request still in
  // flight failed with a reason; the outputs are written, and `tandem run` exits 1 with this.
  std::string run_error;
  // A run on a real backend: the conditions it measured under, and what they put in doubt
  // (summary.json's `conditions` and `warnings`; a simulated run measures nothing and has neither).
  std::optional<MeasureConditions> conditions;
  std::vector<std::string> warnings;
  // `tandem run`'s clock, "wall" or "virtual" (summary.json's `clock`), so that a reader knows
  // what its times are: a measured run under --clock virtual has measured steps but no waiting.
  std::string clock;
};

class MetricsRecorder {
 public:
  // A token of `r` was sampled at `now`.
  void on_token(Request& r, Time now);
  // A step ran for `elapsed`, with `used` of `capacity` KV blocks in use, and
  // that many decoding and prefilling sequences.
  void on_step(Duration elapsed, int32_t used, int32_t capacity, int32_t decode_seqs, int32_t prefill_seqs);
  // What only the engine knows at the end of a run.
  struct RunEnd {
    std::string backend;
    double wall_s = 0;
    Time sim_end = 0;  // the time of the last event handled
    int64_t prefix_evictions = 0;
  };
  // The run's summary, assembled here only (the outputs add the peak RSS after writing).
  Summary summarize(std::span<const Request> reqs, const Workload& w, const RunEnd& end) const;

 private:
  LogHistogram itl_;
  double kv_used_time_ = 0;  // sum of used/capacity * elapsed
  double busy_time_ = 0;
  double kv_peak_ = 0;
  int64_t steps_ = 0, decode_steps_ = 0, decode_steps_with_prefill_ = 0;
};

// Peak resident set size of this process, in KiB (Linux: VmHWM).
int64_t peak_rss_kb();

}  // namespace tandem
