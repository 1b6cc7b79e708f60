#include "sim/engine/metrics.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <fstream>
#include <set>

namespace tandem {

Percentiles percentiles(std::vector<double>& v) {
  Percentiles p;
  p.n = int64_t(v.size());
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  double sum = 0, sq = 0;
  for (double x : v) sum += x;
  p.mean = sum / double(v.size());
  for (double x : v) sq += (x - p.mean) * (x - p.mean);
  p.stddev = std::sqrt(sq / double(v.size()));
  p.max = v.back();
  auto rank = [&](double q) { return v[std::max<size_t>(1, size_t(std::ceil(q / 100.0 * double(v.size())))) - 1]; };
  p.p50 = rank(50);
  p.p90 = rank(90);
  p.p99 = rank(99);
  return p;
}

size_t LogHistogram::bucket(int64_t v) {
  if (v < kSub) return size_t(std::max<int64_t>(v, 0));    // exact below kSub
  const int e = 63 - std::countl_zero(uint64_t(v));        // v in [2^e, 2^(e+1))
  const int shift = e - 8;                                 // log2(kSub) == 8
  const size_t sub = size_t(uint64_t(v) >> shift) - kSub;  // 0..kSub-1
  return size_t(e - 7) * kSub + sub;
}

double LogHistogram::midpoint(size_t b) {
  if (b < kSub) return double(b);
  const int e = int(b / kSub) + 7, shift = e - 8;
  const double lo = double((uint64_t(b % kSub) + kSub) << shift);
  return lo + double(uint64_t(1) << shift) / 2.0;
}

void LogHistogram::add(int64_t v) {
  ++counts_[bucket(v)];
  ++count_;
  sum_ += double(v);
  sum_sq_ += double(v) * double(v);
  max_ = std::max(max_, v);
}

double LogHistogram::stddev() const {
  if (count_ == 0) return 0;
  const double m = mean();
  return std::sqrt(std::max(0.0, sum_sq_ / double(count_) - m * m));
}

double LogHistogram::percentile(double p) const {
  if (count_ == 0) return 0;
  const int64_t rank = std::max<int64_t>(1, int64_t(std::ceil(p / 100.0 * double(count_))));
  int64_t seen = 0;
  for (size_t b = 0; b < counts_.size(); ++b) {
    seen += counts_[b];
    if (seen >= rank) return midpoint(b);
  }
  return midpoint(counts_.size() - 1);
}

std::vector<LogHistogram::Bucket> LogHistogram::buckets() const {
  std::vector<Bucket> out;
  for (size_t b = 0; b < counts_.size(); ++b) {
    if (counts_[b] == 0) continue;
    if (b < kSub) {
      out.push_back({int64_t(b), int64_t(b) + 1, counts_[b]});
    } else {
      const int e = int(b / kSub) + 7, shift = e - 8;
      const int64_t lo = int64_t((uint64_t(b % kSub) + kSub) << shift);
      out.push_back({lo, lo + (int64_t(1) << shift), counts_[b]});
    }
  }
  return out;
}

void MetricsRecorder::on_token(Request& r, Time now) {
  if (r.first_token == kNever) {
    r.first_token = now;
  } else {
    const Duration itl = now - r.last_token;
    itl_.add(itl);
    // Welford's update over this request's ITLs (k-th gap: generated-1 gaps so far incl. this).
    const double k = double(r.generated);  // generated counts tokens before this one
    const double d = double(itl) - r.itl_mean_ns;
    r.itl_mean_ns += d / k;
    r.itl_m2 += d * (double(itl) - r.itl_mean_ns);
    r.itl_max = std::max(r.itl_max, itl);
  }
  r.last_token = now;
}

void MetricsRecorder::on_step(Duration elapsed, int32_t used, int32_t capacity, int32_t decode_seqs,
                              int32_t prefill_seqs) {
  if (decode_seqs > 0) {
    ++decode_steps_;
    decode_steps_with_prefill_ += prefill_seqs > 0;
  }
  const double u = capacity > 0 ? double(used) / capacity : 0.0;
  kv_used_time_ += u * double(elapsed);
  busy_time_ += double(elapsed);
  kv_peak_ = std::max(kv_peak_, u);
  ++steps_;
}

Attainment slo_attainment(std::span<const Request> reqs, const SloSpec& slo) {
  Attainment a;
  a.requests = int64_t(reqs.size());
  a.has_ttft = slo.ttft_ms > 0;
  a.has_tpot = slo.tpot_ms > 0;
  a.slo_ttft_ms = slo.ttft_ms;
  a.slo_tpot_ms = slo.tpot_ms;
  for (const Request& r : reqs) {
    if (r.status != RequestStatus::Finished) {
      ++a.not_finished;
      continue;
    }
    const bool ttft_ok = ttft_ms(r) <= slo.ttft_ms;
    const bool tpot_ok = r.generated <= 1 || tpot_ms(r) <= slo.tpot_ms;
    a.ttft_met += a.has_ttft && ttft_ok;
    a.tpot_met += a.has_tpot && tpot_ok;
    a.both_met += (!a.has_ttft || ttft_ok) && (!a.has_tpot || tpot_ok);
  }
  if (a.requests > 0) {
    a.ttft = double(a.ttft_met) / double(a.requests);
    a.tpot = double(a.tpot_met) / double(a.requests);
    a.both = double(a.both_met) / double(a.requests);
  }
  return a;
}

Summary MetricsRecorder::summarize(std::span<const Request> reqs, const Workload& w, const RunEnd& end) const {
  Summary s;
  s.workload = w.name;
  s.policy = std::string(to_string(w.engine.policy));
  s.backend = end.backend;
  s.total = int64_t(reqs.size());
  std::vector<double> ttft, tpot, e2e, queue;
  Time first_arrival = kNever, last_finish = 0;
  double out_tokens = 0, all_tokens = 0, jitter_sum = 0;
  int64_t jitter_n = 0, good = 0;
  const int32_t bs = w.engine.block_size;
  for (const Request& r : reqs) {
    first_arrival = std::min(first_arrival, r.arrival);
    if (r.finish != kNever) last_finish = std::max(last_finish, r.finish);
    // Prefix cache: one query per admitted request (whatever its end), by tokens and by full blocks.
    if (w.engine.enable_prefix_caching && r.first_scheduled != kNever) {
      ++s.prefix_queries;
      s.prefix_hits += r.num_cached_tokens > 0;
      s.prefix_queried_tokens += r.prompt_len;
      s.prefix_hit_tokens += r.num_cached_tokens;
      s.prefix_queried_blocks += r.prompt_len / bs;
      s.prefix_hit_blocks += r.num_cached_tokens / bs;
    }
    if (r.status == RequestStatus::Failed) {
      ++s.failed;
      ++s.failed_by_reason[std::string(to_string(r.fail_reason))];
      continue;
    }
    if (r.status == RequestStatus::Cancelled) {
      ++s.cancelled;
      continue;
    }
    if (r.status != RequestStatus::Finished) continue;
    ++s.finished;
    const double t_ttft = ttft_ms(r), t_tpot = tpot_ms(r);
    ttft.push_back(t_ttft);
    if (r.generated > 1) tpot.push_back(t_tpot);
    e2e.push_back(to_ms(r.finish - r.arrival));
    queue.push_back(to_ms(r.first_scheduled - r.arrival));
    out_tokens += r.generated;
    all_tokens += double(r.prompt_len) + r.generated;
    if (r.generated > 2) {
      jitter_sum += std::sqrt(r.itl_m2 / double(r.generated - 1)) * 1e-6;
      ++jitter_n;
    }
    const bool ok = (w.slo.ttft_ms <= 0 || t_ttft <= w.slo.ttft_ms) && (w.slo.tpot_ms <= 0 || t_tpot <= w.slo.tpot_ms);
    good += ok;
  }
  s.ttft_ms = percentiles(ttft);
  s.tpot_ms = percentiles(tpot);
  s.e2e_ms = percentiles(e2e);
  s.queue_ms = percentiles(queue);
  s.itl_ms = {itl_.mean() * 1e-6,
              itl_.percentile(50) * 1e-6,
              itl_.percentile(90) * 1e-6,
              itl_.percentile(99) * 1e-6,
              double(itl_.max()) * 1e-6,
              itl_.stddev() * 1e-6,
              itl_.count()};
  s.decode_steps = decode_steps_;
  s.decode_steps_with_prefill = decode_steps_with_prefill_;
  s.decode_steps_with_prefill_share = decode_steps_ ? double(decode_steps_with_prefill_) / double(decode_steps_) : 0.0;
  s.itl_histogram_ns = itl_.buckets();
  s.jitter_ms = jitter_n ? jitter_sum / double(jitter_n) : 0.0;
  s.makespan_s = first_arrival != kNever && last_finish > first_arrival ? to_seconds(last_finish - first_arrival) : 0.0;
  if (s.makespan_s > 0) {
    s.requests_per_s = double(s.finished) / s.makespan_s;
    s.output_tokens_per_s = out_tokens / s.makespan_s;
    s.total_tokens_per_s = all_tokens / s.makespan_s;
    s.goodput_requests_per_s = double(good) / s.makespan_s;
  }
  s.goodput_fraction = s.finished ? double(good) / double(s.finished) : 0.0;
  Time last_arrival = 0;
  for (const Request& r : reqs) last_arrival = std::max(last_arrival, r.arrival);
  s.offered_rate = last_arrival > 0 ? double(reqs.size()) / to_seconds(last_arrival) : 0.0;
  if (!w.requests.trace && w.requests.arrival.kind != ArrivalSpec::Kind::Burst) {
    s.configured_rate = w.requests.arrival.rate;
    s.arrival_normalized = w.requests.arrival.normalize;
  }
  s.has_slo = w.slo.any();
  if (s.has_slo) s.attainment = slo_attainment(reqs, w.slo);
  s.slo_ttft_ms = w.slo.ttft_ms;
  s.slo_tpot_ms = w.slo.tpot_ms;
  s.prefix_enabled = w.engine.enable_prefix_caching;
  s.prefix_off_reason = w.engine.prefix_caching_off_reason;
  s.prefix_hit_rate = s.prefix_queried_tokens ? double(s.prefix_hit_tokens) / double(s.prefix_queried_tokens) : 0.0;
  s.prefix_block_hit_rate =
      s.prefix_queried_blocks ? double(s.prefix_hit_blocks) / double(s.prefix_queried_blocks) : 0.0;
  s.kv_blocks = w.engine.resolved_kv_blocks;
  s.kv_mean_util = busy_time_ > 0 ? kv_used_time_ / busy_time_ : 0.0;
  s.kv_peak_util = kv_peak_;
  s.steps = steps_;
  s.sim_s = to_seconds(end.sim_end);
  s.wall_s = end.wall_s;
  s.prefix_evictions = end.prefix_evictions;
  s.peak_rss_kb = peak_rss_kb();
  return s;
}

int32_t RunLayout::num_ranks() const {
  int32_t n = 0;
  for (const InstanceLayout& in : instances) n += in.tp;
  return n;
}

int32_t RunLayout::num_gpus() const {
  std::set<int32_t> devices;  // local CUDA instances: replicas may share a device
  int32_t n = 0;
  for (const InstanceLayout& in : instances) {
    if (in.first_gpu < 0) {
      n += in.gpus;
      continue;
    }
    for (int32_t d = in.first_gpu; d < in.first_gpu + in.gpus; ++d) devices.insert(d);
  }
  return n + int32_t(devices.size());
}

int64_t peak_rss_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  return 0;
}

}  // namespace tandem
