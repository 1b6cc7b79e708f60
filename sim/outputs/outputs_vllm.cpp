#include "sim/outputs/outputs_vllm.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "sim/engine/engine.h"
#include "sim/outputs/outputs_schema.h"

namespace tandem {

namespace {

// The ITL histogram: exact below 2^12 ns, then 2^12 buckets per power of two, so that a bucket
// holds at most v / 4096 distinct integer values (4 µs wide around 20 ms).
constexpr int kSubBits = 12;
constexpr size_t kNumBuckets = size_t(64 - kSubBits + 1) << kSubBits;

size_t bucket_of(int64_t v) {
  if (v < (int64_t(1) << kSubBits)) return size_t(std::max<int64_t>(v, 0));
  const int e = int(std::bit_width(uint64_t(v))) - 1;  // v in [2^e, 2^(e+1)), e >= kSubBits
  return (size_t(e - kSubBits + 1) << kSubBits) | size_t((uint64_t(v) >> (e - kSubBits)) - (uint64_t(1) << kSubBits));
}

// Nanoseconds as seconds: the double nearest to ns / 1e9, the value a reader of the printed
// number gets back, so that statistics recomputed from the file's arrays match.
double seconds(int64_t ns) { return double(ns) / 1e9; }

// numpy's interpolation between two neighbouring order statistics (numpy/lib/_function_base_impl.py,
// _lerp): from the upper one when t >= 0.5.
double np_lerp(double a, double b, double t) {
  const double diff = b - a;
  return t >= 0.5 ? b - diff * (1 - t) : a + diff * t;
}

// The ranks (0-based) whose values np.percentile(a, p) (method "linear") and np.median(a) read.
struct Ranks {
  int64_t lo, hi;
  double t;  // percentile: weight of hi; median: unused (the mean of lo and hi)
};
Ranks percentile_ranks(int64_t n, double p) {
  const double virtual_index = double(n - 1) * (p / 100);
  const auto lo = int64_t(std::floor(virtual_index));
  return {lo, std::min(lo + 1, n - 1), virtual_index - double(lo)};
}
Ranks median_ranks(int64_t n) { return n % 2 ? Ranks{n / 2, n / 2, 0} : Ranks{n / 2 - 1, n / 2, 0}; }

// mean, median, std (population) and p99 of values in seconds, as vLLM reports them: numpy's,
// times 1000; all 0 without values (vLLM's np.mean(x or 0)).
struct MsStats {
  double mean = 0, median = 0, std = 0, p99 = 0;
};

MsStats ms_stats(std::vector<double>& v) {
  MsStats m;
  if (v.empty()) return m;
  std::sort(v.begin(), v.end());
  const auto n = int64_t(v.size());
  long double sum = 0, sq = 0;
  for (double x : v) sum += x;
  const double mean = double(sum / n);
  for (double x : v) sq += (long double)(x - mean) * (x - mean);
  const Ranks med = median_ranks(n), p99 = percentile_ranks(n, 99);
  m.mean = mean * 1000;
  m.std = std::sqrt(double(sq / n)) * 1000;
  m.median = (v[size_t(med.lo)] + v[size_t(med.hi)]) / 2 * 1000;
  m.p99 = np_lerp(v[size_t(p99.lo)], v[size_t(p99.hi)], p99.t) * 1000;
  return m;
}

// The run's request rate and burstiness in vLLM's terms (it draws gaps from a gamma
// distribution of shape `burstiness`, mean 1 / rate; "inf" sends every request at once).
std::pair<nlohmann::json, nlohmann::json> arrival_in_vllm_terms(const Workload& w, const std::vector<Request>& reqs) {
  if (w.requests.trace) {  // a replay: 1 / the mean gap between arrivals
    if (reqs.size() < 2 || reqs.back().arrival <= reqs.front().arrival) return {"inf", 1.0};
    return {double(reqs.size() - 1) / seconds(reqs.back().arrival - reqs.front().arrival), 1.0};
  }
  const ArrivalSpec& a = w.requests.arrival;
  switch (a.kind) {
    case ArrivalSpec::Kind::Poisson: return {a.rate, 1.0};
    case ArrivalSpec::Kind::Gamma: return {a.rate, 1.0 / (a.cv * a.cv)};  // a gamma's cv is 1 / sqrt(shape)
    case ArrivalSpec::Kind::Constant: return {a.rate, "inf"};             // the limit of ever larger shapes
    case ArrivalSpec::Kind::Burst:
      if (a.burst_size <= 0 || a.interval_s <= 0) return {"inf", 1.0};
      return {double(a.burst_size) / a.interval_s, 1.0};  // the mean rate; vLLM has no bursts
  }
  return {"inf", 1.0};
}

std::string_view error_of(const Request& r) {
  if (r.status == RequestStatus::Finished) return "";
  if (r.status == RequestStatus::Failed) return to_string(r.fail_reason);
  return to_string(r.status);  // cancelled (or, were one left, still alive)
}

// The output file, written through a buffer, one line, as Python's json.dump separates items.
class JsonLine {
 public:
  explicit JsonLine(const std::string& path) : f_(std::fopen(path.c_str(), "wb")), failed_(!f_) {}
  ~JsonLine() {
    if (f_) std::fclose(f_);
  }
  void key(std::string_view k) {
    raw(first_ ? "{\"" : ", \"");
    first_ = false;
    raw(k);
    raw("\": ");
  }
  // Scalars and strings as json.dump writes them (ensure_ascii, 1.0 for a float that is whole).
  void value(const nlohmann::json& v) { raw(v.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace)); }
  void number(double x) {  // a float, as Python's repr: the shortest form that reads back the same
    const size_t at = buf_.size();
    fmt::format_to(std::back_inserter(buf_), "{}", x);
    if (std::string_view(buf_.data() + at, buf_.size() - at).find_first_of(".eni") == std::string_view::npos) raw(".0");
  }
  void integer(int64_t x) { fmt::format_to(std::back_inserter(buf_), "{}", x); }
  void field(std::string_view k, const nlohmann::json& v) {
    key(k);
    value(v);
  }
  void field_number(std::string_view k, double x) {
    key(k);
    number(x);
  }
  void field_integer(std::string_view k, int64_t x) {
    key(k);
    integer(x);
  }
  void raw(std::string_view s) {
    buf_.append(s.data(), s.data() + s.size());
    if (buf_.size() >= kChunk) flush();
  }
  bool close() {
    raw("}");
    flush();
    if (f_ && std::fclose(f_) != 0) failed_ = true;
    f_ = nullptr;
    return !failed_;
  }

 private:
  static constexpr size_t kChunk = size_t(1) << 20;
  std::FILE* f_;
  bool failed_;
  bool first_ = true;
  fmt::memory_buffer buf_;
  void flush() {
    if (f_ && buf_.size() && std::fwrite(buf_.data(), 1, buf_.size(), f_) != buf_.size()) failed_ = true;
    buf_.clear();
  }
};

}  // namespace

VllmResult::VllmResult(const std::string& dir, bool detailed) : dir_(dir), detailed_(detailed) {
  const std::string path = dir + "/.vllm_result.tokens";
  scratch_ = std::fopen(path.c_str(), "w+b");
  if (!scratch_) throw InputError(fmt::format("--out {}: cannot write files there", dir));
  std::remove(path.c_str());  // open and unlinked: gone when closed, however the run ends
  itl_buckets_.assign(kNumBuckets, 0);
}

VllmResult::~VllmResult() {
  if (scratch_) std::fclose(scratch_);
}

void VllmResult::make_room(ReqId id) {
  if (size_t(id) < in_flight_.size()) return;
  const size_t n = std::max(size_t(id) + 1, 2 * in_flight_.size());
  in_flight_.resize(n);
  offset_.resize(n, 0);
  num_tokens_.resize(n, -1);
}

void VllmResult::on_step(const StepRecord& r) {
  for (const ScheduledSeq& s : r.plan->seqs) {
    if (!s.samples) continue;
    make_room(s.id);
    in_flight_[size_t(s.id)].push_back(r.tokens_at);
  }
}

void VllmResult::on_request_done(const Request& r) {
  if (r.alive()) return;  // left one instance for another (prefill -> decode)
  make_room(r.id);
  if (r.status == RequestStatus::Finished)
    spill(r.id, r.first_token);
  else
    std::vector<Time>().swap(in_flight_[size_t(r.id)]);
}

void VllmResult::spill(ReqId id, Time first_token) {
  std::vector<Time>& t = in_flight_[size_t(id)];
  if (!t.empty() && first_token != kNever) t.front() = first_token;
  offset_[size_t(id)] = scratch_len_;
  num_tokens_[size_t(id)] = int32_t(t.size());
  if (!t.empty() && std::fwrite(t.data(), sizeof(Time), t.size(), scratch_) != t.size()) failed_ = true;
  scratch_len_ += t.size() * sizeof(Time);
  for (size_t i = 1; i < t.size(); ++i) {
    const Duration gap = t[i] - t[i - 1];
    ++itl_buckets_[bucket_of(gap)];
    itl_sum_s_ += seconds(gap);
    ++num_itls_;
  }
  std::vector<Time>().swap(t);
}

bool VllmResult::read_tokens(ReqId id, std::vector<Time>& out) {
  const int32_t n = size_t(id) < num_tokens_.size() ? num_tokens_[size_t(id)] : -1;
  out.resize(size_t(std::max(n, 0)));
  if (n <= 0) return true;
  const size_t bytes = size_t(n) * sizeof(Time);
  auto* p = reinterpret_cast<char*>(out.data());
  for (size_t done = 0; done < bytes;) {
    const ssize_t got = ::pread(fileno(scratch_), p + done, bytes - done, off_t(offset_[size_t(id)] + done));
    if (got <= 0) return false;
    done += size_t(got);
  }
  return true;
}

VllmGpuKeys vllm_gpu_keys(const nlohmann::json& layout) {
  const auto integer = [](const nlohmann::json& o, const char* key) -> std::optional<int64_t> {
    if (o.is_object() && o.contains(key) && o[key].is_number_integer()) return o[key].get<int64_t>();
    return std::nullopt;
  };
  VllmGpuKeys k;
  k.num_gpus = integer(layout, "num_gpus");
  if (!k.num_gpus || *k.num_gpus <= 0) return k;
  const bool pd = layout.contains("disaggregation") && layout["disaggregation"].is_boolean() &&
                  layout["disaggregation"].get<bool>();
  if (pd || !layout.contains("instances") || !layout["instances"].is_array() || layout["instances"].empty()) return k;
  std::optional<int64_t> tp;
  for (const nlohmann::json& in : layout["instances"]) {
    const std::optional<int64_t> t = integer(in, "tp");
    if (!t || (tp && *t != *tp)) return k;  // replicas of different TP: no one product
    tp = t;
  }
  const int64_t dp = int64_t(layout["instances"].size());
  if (*tp * dp != *k.num_gpus) return k;  // e.g. CUDA replicas sharing a device
  k.tensor_parallel_size = tp;
  k.data_parallel_size = dp;
  return k;
}

bool VllmResult::write(const Engine& e, const Summary& s, const Workload& w) {
  const std::vector<Request>& reqs = e.requests();
  // A finished request always left through on_request_done; should one not have, take it now.
  for (const Request& r : reqs)
    if (r.status == RequestStatus::Finished && (size_t(r.id) >= num_tokens_.size() || num_tokens_[size_t(r.id)] < 0)) {
      make_room(r.id);
      spill(r.id, r.first_token);
    }
  if (std::fflush(scratch_) != 0) failed_ = true;

  // Per completed request, as vLLM's calculate_metrics: TTFT, TPOT (2+ tokens), E2E latency.
  std::vector<double> ttfts, tpots, e2els;
  int64_t completed = 0, total_input = 0, total_output = 0;
  Time min_start = kNever, max_end = 0;
  for (const Request& r : reqs) {
    if (r.status != RequestStatus::Finished) continue;
    ++completed;
    total_input += r.prompt_len;
    total_output += r.generated;
    const double ttft = r.first_token != kNever ? seconds(r.first_token - r.arrival) : 0.0;
    const double latency = seconds(r.finish - r.arrival);
    ttfts.push_back(ttft);
    e2els.push_back(latency);
    if (r.generated > 1) tpots.push_back((latency - ttft) / (r.generated - 1));
    min_start = std::min(min_start, r.arrival);
    max_end = std::max(max_end, r.finish);
  }
  const double duration = s.makespan_s;
  auto per_s = [&](double x) { return duration > 0 ? x / duration : 0.0; };

  // Peak output tokens in a second and peak requests in flight in a second, over one-second
  // buckets from the first completed request's start (vLLM's max_output_tokens_per_s and
  // max_concurrent_requests; completed requests only). vLLM fills an array with every second of
  // the run; only the seconds where something happens are kept here (a token, an arrival, a
  // finish), with the same maxima, so that memory and time follow the steps and requests, never
  // the clock: a run whose arrivals are a year apart costs what one a second apart does.
  int64_t num_seconds = 0;
  std::unordered_map<int64_t, int64_t> tokens_per_second;     // second -> tokens; only seconds with one
  std::vector<std::pair<int64_t, int64_t>> in_flight_change;  // (second, +1 at arrival / -1 after finish)
  if (completed > 0) {
    num_seconds = int64_t(std::ceil(seconds(max_end - min_start))) + 1;
    in_flight_change.reserve(size_t(2 * completed));
    for (const Request& r : reqs) {
      if (r.status != RequestStatus::Finished) continue;
      in_flight_change.emplace_back((r.arrival - min_start) / kNsPerS, 1);
      in_flight_change.emplace_back((r.finish - min_start) / kNsPerS + 1, -1);
    }
    std::sort(in_flight_change.begin(), in_flight_change.end());
  }

  // The ranks the ITL median and p99 need, and the histogram buckets that hold them.
  const Ranks itl_median = median_ranks(num_itls_), itl_p99 = percentile_ranks(num_itls_, 99);
  const int64_t wanted[] = {itl_median.lo, itl_median.hi, itl_p99.lo, itl_p99.hi};
  std::map<size_t, int64_t> below;  // wanted bucket -> gaps in the buckets before it
  if (num_itls_ > 0) {
    int64_t seen = 0;
    for (size_t b = 0; b < itl_buckets_.size(); ++b) {
      for (int64_t rank : wanted)
        if (rank >= seen && rank < seen + itl_buckets_[b]) below[b] = seen;
      seen += itl_buckets_[b];
    }
  }
  std::map<size_t, std::map<int64_t, int64_t>> in_wanted;  // wanted bucket -> value -> count
  const double itl_mean_s = num_itls_ ? double(itl_sum_s_ / num_itls_) : 0.0;
  long double itl_sq = 0;

  // The one read-back of the token times, in request order: the ITL statistics and the
  // per-second buckets, and the itls array when the file has one.
  std::vector<Time> tokens;
  auto read_back = [&](const Request& r) {
    if (r.status != RequestStatus::Finished) {
      tokens.clear();
      return;
    }
    if (!read_tokens(r.id, tokens)) failed_ = true;
    int64_t last_sec = -1, *last_count = nullptr;  // a request's tokens come in time order: one lookup a second
    for (size_t i = 0; i < tokens.size(); ++i) {
      const int64_t sec = (tokens[i] - min_start) / kNsPerS;
      if (sec >= 0 && sec < num_seconds) {
        if (sec != last_sec) last_count = &tokens_per_second[sec];  // a reference outlives rehashing
        last_sec = sec;
        ++*last_count;
      }
      if (i == 0) continue;
      const Duration gap = tokens[i] - tokens[i - 1];
      const double d = seconds(gap) - itl_mean_s;
      itl_sq += (long double)d * d;
      if (const size_t b = bucket_of(gap); below.count(b)) ++in_wanted[b][gap];
    }
  };

  JsonLine out(dir_ + "/vllm_result.json");
  // main_async's keys, in its order: setup, then traffic.
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(date, sizeof date, "%Y%m%d-%H%M%S", &local);
  const std::string backend = "tandem-" + s.backend;
  const auto [request_rate, burstiness] = arrival_in_vllm_terms(w, reqs);
  out.field("date", date);
  out.field("endpoint_type", backend);
  out.field("backend", backend);
  out.field("label", nullptr);
  out.field("model_id", w.model.name);
  out.field("tokenizer_id", w.model.name);
  out.field_integer("num_prompts", s.total);
  out.field("request_rate", request_rate);
  out.field("burstiness", burstiness);
  out.field("max_concurrency", nullptr);
  // benchmark()'s result, in its order.
  out.field_number("duration", duration);
  out.field_integer("completed", completed);
  out.field_integer("failed", s.total - completed);
  out.field_integer("total_input_tokens", total_input);
  out.field_integer("total_output_tokens", total_output);
  out.field_number("request_throughput", per_s(double(completed)));
  out.key("request_goodput");
  if (s.has_slo)
    out.number(s.goodput_requests_per_s);
  else
    out.value(nullptr);
  out.field_number("output_throughput", per_s(double(total_output)));
  out.field_number("total_token_throughput", per_s(double(total_input + total_output)));
  // One entry per request, in id (= arrival) order; a request that did not finish has vLLM's
  // failed entry: output length 0, TTFT and latency 0.0, no ITLs, and its error.
  auto array = [&](const char* name, auto&& item) {
    out.key(name);
    out.raw("[");
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (i) out.raw(", ");
      item(reqs[i]);
    }
    out.raw("]");
  };
  // vLLM 0.34 keeps these two arrays in a plain --save-result too: the end-to-end latency
  // (arrival to the last token) and the time waited for the client's concurrency slot, which an
  // open-loop arrival never waits (vLLM's 0.0 without --max-concurrency).
  auto latencies = [&] {
    array("latencies", [&](const Request& r) {
      out.number(r.status == RequestStatus::Finished && r.finish != kNever ? seconds(r.finish - r.arrival) : 0.0);
    });
  };
  auto queue_times = [&] { array("queue_times", [&](const Request&) { out.number(0.0); }); };
  if (detailed_) {
    array("input_lens", [&](const Request& r) { out.integer(r.prompt_len); });
    array("output_lens", [&](const Request& r) { out.integer(r.status == RequestStatus::Finished ? r.generated : 0); });
    array("ttfts", [&](const Request& r) {
      out.number(r.status == RequestStatus::Finished && r.first_token != kNever ? seconds(r.first_token - r.arrival)
                                                                                : 0.0);
    });
    array("itls", [&](const Request& r) {
      read_back(r);
      out.raw("[");
      for (size_t i = 1; i < tokens.size(); ++i) {
        if (i > 1) out.raw(", ");
        out.number(seconds(tokens[i] - tokens[i - 1]));
      }
      out.raw("]");
    });
    latencies();
    array("start_times", [&](const Request& r) { out.number(seconds(r.arrival)); });
    queue_times();
    array("generated_texts", [&](const Request&) { out.raw("\"\""); });  // tandem has no text
    array("errors", [&](const Request& r) { out.value(std::string(error_of(r))); });
  } else {
    latencies();
    queue_times();
    for (const Request& r : reqs) read_back(r);
  }

  // The ITL statistics from the histogram's wanted buckets.
  auto value_at = [&](int64_t rank) {
    for (const auto& [bucket, first_rank] : below) {
      if (rank < first_rank || rank >= first_rank + itl_buckets_[bucket]) continue;
      int64_t seen = first_rank;
      for (const auto& [v, count] : in_wanted[bucket]) {
        if (rank < seen + count) return seconds(v);
        seen += count;
      }
    }
    return 0.0;
  };
  MsStats itl;
  if (num_itls_ > 0) {
    itl.mean = itl_mean_s * 1000;
    itl.std = std::sqrt(double(itl_sq / num_itls_)) * 1000;
    itl.median = (value_at(itl_median.lo) + value_at(itl_median.hi)) / 2 * 1000;
    itl.p99 = np_lerp(value_at(itl_p99.lo), value_at(itl_p99.hi), itl_p99.t) * 1000;
  }
  // In flight in a second: the changes up to it; the count changes only at the kept seconds.
  int64_t max_in_flight = 0, in_flight = 0;
  for (size_t i = 0; i < in_flight_change.size(); ++i) {
    in_flight += in_flight_change[i].second;
    if (i + 1 == in_flight_change.size() || in_flight_change[i + 1].first != in_flight_change[i].first)
      max_in_flight = std::max(max_in_flight, in_flight);
  }
  int64_t max_tokens_per_s = 0;
  for (const auto& [sec, count] : tokens_per_second) max_tokens_per_s = std::max(max_tokens_per_s, count);
  out.field_number("max_output_tokens_per_s", double(max_tokens_per_s));
  out.field_integer("max_concurrent_requests", max_in_flight);
  out.field_number("rtfx", 0.0);  // audio seconds transcribed per second: speech only

  // --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 99 (vLLM's default leaves out e2el).
  const MsStats per_metric[] = {ms_stats(ttfts), ms_stats(tpots), itl, ms_stats(e2els)};
  const char* names[] = {"ttft", "tpot", "itl", "e2el"};
  for (size_t i = 0; i < 4; ++i) {
    out.field_number(fmt::format("mean_{}_ms", names[i]), per_metric[i].mean);
    out.field_number(fmt::format("median_{}_ms", names[i]), per_metric[i].median);
    out.field_number(fmt::format("std_{}_ms", names[i]), per_metric[i].std);
    out.field_number(fmt::format("p99_{}_ms", names[i]), per_metric[i].p99);
  }
  // tandem's own keys after vLLM's (as `vllm bench serve --metadata` adds keys): the run's GPUs
  // (vllm_gpu_keys, which plot_pareto's per-GPU figures need), then SLO attainment over all
  // num_prompts requests, failed ones counting as misses; null without that bound.
  const VllmGpuKeys gpus = vllm_gpu_keys(layout_json(s.layout));
  out.field("num_gpus", gpus.num_gpus ? nlohmann::json(*gpus.num_gpus) : nlohmann::json(nullptr));
  if (gpus.tensor_parallel_size && gpus.data_parallel_size) {
    out.field_integer("tensor_parallel_size", *gpus.tensor_parallel_size);
    out.field_integer("data_parallel_size", *gpus.data_parallel_size);
  }
  const Attainment& a = s.attainment;
  auto fraction = [&](const char* k, bool has, double v) {
    out.key(k);
    if (s.has_slo && has)
      out.number(v);
    else
      out.value(nullptr);
  };
  fraction("slo_attainment_ttft", a.has_ttft, a.ttft);
  fraction("slo_attainment_tpot", a.has_tpot, a.tpot);
  fraction("slo_attainment", true, a.both);
  out.field_integer("slo_attainment_denominator", s.total);
  const bool ok = out.close();
  return ok && !failed_;
}

}  // namespace tandem
