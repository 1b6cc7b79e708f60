#include "sim/outputs.h"

#include "backend/cost_model.h"
#include "sim/config.h"

#include <fmt/compile.h>
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <stdexcept>
#include <string_view>
#include <utility>

namespace tandem {

namespace {
nlohmann::json pct_json(const Percentiles& p) {
  return {{"mean", p.mean}, {"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99},
          {"max", p.max},   {"std", p.stddev}, {"count", p.n}};
}
double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

nlohmann::json summary_json(const Summary& s, const Workload& w) {
  nlohmann::json j;
  j["workload"] = s.workload;
  j["workload_path"] = w.path;
  j["policy"] = s.policy;
  j["backend"] = s.backend;
  j["model"] = w.model.name;
  j["hardware"] = w.hardware.name;
  j["seed"] = w.seed;
  j["ttft_ms"] = pct_json(s.ttft_ms);
  j["tpot_ms"] = pct_json(s.tpot_ms);
  j["itl_ms"] = pct_json(s.itl_ms);
  j["e2e_ms"] = pct_json(s.e2e_ms);
  // Inter-token latencies as a histogram: [lower ms, upper ms, count] per non-empty bucket.
  nlohmann::json hist = nlohmann::json::array();
  for (const auto& b : s.itl_histogram_ns) hist.push_back({double(b.lo) * 1e-6, double(b.hi) * 1e-6, b.count});
  j["itl_histogram_ms"] = hist;
  j["queue_ms"] = pct_json(s.queue_ms);
  j["throughput"] = {{"requests_per_s", s.requests_per_s},
                     {"output_tokens_per_s", s.output_tokens_per_s},
                     {"total_tokens_per_s", s.total_tokens_per_s}};
  j["requests"] = {{"total", s.total}, {"finished", s.finished}, {"failed", s.failed}, {"cancelled", s.cancelled},
                   {"failed_by_reason", s.failed_by_reason}};
  j["jitter_ms"] = s.jitter_ms;
  // How often decodes shared their step with prefill work (a whole prompt or a chunk).
  j["steps_mix"] = {{"decode_steps", s.decode_steps},
                    {"decode_steps_with_prefill", s.decode_steps_with_prefill},
                    {"decode_steps_with_prefill_share", s.decode_steps_with_prefill_share}};
  j["engine"] = {{"enable_chunked_prefill", w.engine.enable_chunked_prefill},
                 {"max_num_batched_tokens", w.engine.max_num_batched_tokens},
                 {"max_num_partial_prefills", w.engine.max_num_partial_prefills},
                 {"max_num_seqs", w.engine.max_num_seqs},
                 {"enable_prefix_caching", w.engine.enable_prefix_caching},
                 {"block_size", w.engine.block_size}};
  j["prefix_cache"] = {{"enabled", s.prefix_enabled},
                       {"hit_rate", s.prefix_hit_rate},
                       {"block_hit_rate", s.prefix_block_hit_rate},
                       {"hit_tokens", s.prefix_hit_tokens},
                       {"queried_tokens", s.prefix_queried_tokens},
                       {"hit_blocks", s.prefix_hit_blocks},
                       {"queried_blocks", s.prefix_queried_blocks},
                       {"queries", s.prefix_queries},
                       {"hits", s.prefix_hits},
                       {"evictions", s.prefix_evictions}};
  j["kv_cache"] = {{"blocks", s.kv_blocks}, {"block_size", w.engine.block_size},
                   {"mean_util", s.kv_mean_util}, {"peak_util", s.kv_peak_util}};
  if (s.has_slo)
    j["goodput"] = {{"slo_ttft_ms", s.slo_ttft_ms}, {"slo_tpot_ms", s.slo_tpot_ms},
                    {"requests_per_s", s.goodput_requests_per_s}, {"fraction", s.goodput_fraction}};
  j["steps"] = s.steps;
  j["makespan_s"] = s.makespan_s;
  j["sim_s"] = s.sim_s;
  j["wall_s"] = s.wall_s;
  j["peak_rss_mb"] = double(s.peak_rss_kb) / 1024.0;
  return j;
}

void print_summary(std::ostream& os, const Summary& s) {
  fmt::print(os, "workload {}  policy {}  backend {}\n", s.workload, s.policy, s.backend);
  fmt::print(os, "requests {}: finished {}, cancelled {}, failed {}", s.total, s.finished, s.cancelled, s.failed);
  for (const auto& [why, n] : s.failed_by_reason) fmt::print(os, " [{} {}]", why, n);
  fmt::print(os, "\n");
  fmt::print(os, "{:<10}{:>12}{:>12}{:>12}{:>12}{:>12}{:>12}\n", "metric", "mean", "p50", "p90", "p99", "max", "std");
  auto row = [&](const char* name, const Percentiles& p) {
    fmt::print(os, "{:<10}{:>12.2f}{:>12.2f}{:>12.2f}{:>12.2f}{:>12.2f}{:>12.2f}\n", name, p.mean, p.p50, p.p90, p.p99,
               p.max, p.stddev);
  };
  row("TTFT ms", s.ttft_ms);
  row("TPOT ms", s.tpot_ms);
  row("ITL ms", s.itl_ms);
  row("E2E ms", s.e2e_ms);
  row("queue ms", s.queue_ms);
  fmt::print(os, "throughput {:.3f} req/s, {:.1f} output tok/s, {:.1f} total tok/s\n", s.requests_per_s,
             s.output_tokens_per_s, s.total_tokens_per_s);
  if (s.has_slo)
    fmt::print(os, "goodput {:.3f} req/s ({:.1f}% of finished meet ttft<={}ms tpot<={}ms)\n", s.goodput_requests_per_s,
               100 * s.goodput_fraction, s.slo_ttft_ms, s.slo_tpot_ms);
  fmt::print(os, "KV cache {} blocks: mean use {:.1f}%, peak {:.1f}%   jitter {:.2f} ms\n", s.kv_blocks,
             100 * s.kv_mean_util, 100 * s.kv_peak_util, s.jitter_ms);
  fmt::print(os, "decode steps {}: {:.1f}% also carried prefill tokens\n", s.decode_steps,
             100 * s.decode_steps_with_prefill_share);
  if (s.prefix_enabled)
    fmt::print(os, "prefix cache: hit rate {:.1f}% of prompt tokens ({:.1f}% of full blocks), {} of {} requests hit, {} evictions\n",
               100 * s.prefix_hit_rate, 100 * s.prefix_block_hit_rate, s.prefix_hits, s.prefix_queries, s.prefix_evictions);
  else
    fmt::print(os, "prefix cache: off\n");
  fmt::print(os, "steps {}  simulated {:.3f} s  wall {:.3f} s  peak RSS {:.0f} MB\n", s.steps, s.sim_s, s.wall_s,
             double(s.peak_rss_kb) / 1024.0);
}

TraceDetail parse_trace_detail(const std::string& s) {
  if (s == "full") return TraceDetail::Full;
  if (s == "steps") return TraceDetail::Steps;
  if (s == "requests") return TraceDetail::Requests;
  if (s == "none") return TraceDetail::None;
  throw InputError(fmt::format("--trace {}: expected none, requests, steps or full", s));
}

namespace {
constexpr size_t kBatchRows = 4096;  // steps handed to the writer at a time
constexpr size_t kMaxQueued = 32;    // batches in flight before on_step waits for the writer
// Room for one row or event: at most 330 characters per number (a double's {:.9f} is at
// most 309 digits before the point), at most 9 numbers of that kind per row.
constexpr size_t kRowRoom = 4096;

// Each level holds the one before it.
bool has_requests(TraceDetail d) { return d >= TraceDetail::Requests; }  // and the counters
bool has_steps(TraceDetail d) { return d >= TraceDetail::Steps; }
bool has_step_args(TraceDetail d) { return d >= TraceDetail::Full; }

// Writers into a buffer with room (kRowRoom), returning the new end. The files' numbers are
// fmt's {} and {:.Nf}; these give the same bytes faster (fmt formats a double with fixed
// precision in 70-500 ns, an integer in about 10).
template <size_t N>
char* put(char* p, const char (&text)[N]) {
  std::memcpy(p, text, N - 1);
  return p + N - 1;
}
char* put_int(char* p, int64_t v) { return fmt::format_to(p, FMT_COMPILE("{}"), v); }

// {:.Nf} of `d`, where d is the integer t scaled by 10^-N (nanoseconds as seconds with N = 9,
// as ms with 6, as µs with 3; d = t * 1e-N or t / 1eN). Below 1e15 the double is within a
// quarter unit of the last printed digit of t * 10^-N (relative error <= 2^-52), so
// formatting it rounds to exactly t's digits: print those. Larger or negative t: fmt.
template <int N>
char* put_scaled(char* p, int64_t t, double d) {
  static_assert(N == 3 || N == 6 || N == 9);
  constexpr int64_t scale = N == 3 ? 1'000 : N == 6 ? 1'000'000 : 1'000'000'000;
  if (t < 0 || t >= 1'000'000'000'000'000) return fmt::format_to(p, FMT_COMPILE("{:.{}f}"), d, N);
  p = put_int(p, t / scale);
  *p++ = '.';
  const fmt::format_int frac(t % scale + scale);  // 1 then the N digits, leading zeros kept
  std::memcpy(p, frac.data() + 1, N);
  return p + N;
}

// {:.0f} of a double: an integer-valued one (attention pairs, context tokens) is its integer.
char* put_fixed0(char* p, double v) {
  if (v >= 0 && !std::signbit(v) && v < 9007199254740992.0 && v == std::trunc(v)) return put_int(p, int64_t(v));
  return fmt::format_to(p, FMT_COMPILE("{:.0f}"), v);
}

// {:.6f} of a double, remembered: a step's KV use and cost terms mostly repeat values seen
// before (the same batch shape costs the same), so most rows copy text instead.
template <int kLog2Slots>
class Fixed6Cache {
 public:
  char* put(char* p, double v) {
    const uint64_t bits = std::bit_cast<uint64_t>(v);
    Slot& s = slots_[(bits * 0x9E3779B97F4A7C15ull) >> (64 - kLog2Slots)];
    if (s.len == 0 || s.bits != bits) {
      const auto r = fmt::format_to_n(s.text, sizeof s.text, FMT_COMPILE("{:.6f}"), v);
      if (r.size > sizeof s.text) {  // too long to keep (huge or non-finite values)
        s.len = 0;
        return fmt::format_to(p, FMT_COMPILE("{:.6f}"), v);
      }
      s.bits = bits;
      s.len = uint8_t(r.size);
    }
    std::memcpy(p, s.text, sizeof s.text);  // whole slot: a fixed-size copy; the room allows it
    return p + s.len;
  }

 private:
  struct Slot {
    uint64_t bits = 0;
    uint8_t len = 0;  // 0: empty
    char text[23];  // 32-byte slots
  };
  std::array<Slot, size_t(1) << kLog2Slots> slots_{};
};
}  // namespace

// The writer thread's state for the step rows.
struct RunOutputs::StepFormatter {
  // Sized by misses on the Azure conversation hour (806k steps): KV use 3% (1.9k distinct
  // values), GEMM 2% (7.7k, in runs), overhead and communication constant. The attention
  // term is new almost every step (a cache of 4,096 misses 67%): formatted each time.
  Fixed6Cache<12> kv_util;
  Fixed6Cache<8> gemm;
  Fixed6Cache<4> overhead, comm;
  // Counters are written only when they change (lossless: a counter holds its last value).
  int32_t last_waiting = -1, last_running = -1, last_kv = -1;
  Time last_counter_ts = 0;
};

bool RunOutputs::File::open(const std::string& path) {
  f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  std::setvbuf(f, nullptr, _IONBF, 0);  // `data` is the buffer: whole chunks go straight to write(2)
  return true;
}

void RunOutputs::File::make_room(size_t n) {
  if (f) flush();  // an open file empties the buffer; one in memory only (f null) grows
  if (cap - len >= n) return;
  const size_t want = std::max({n + len, 2 * cap, kChunk + kRowRoom});
  auto bigger = std::make_unique_for_overwrite<char[]>(want);
  if (len) std::memcpy(bigger.get(), data.get(), len);
  data = std::move(bigger);
  cap = want;
}

void RunOutputs::File::append(std::string_view s) {
  char* p = room(s.size());
  std::memcpy(p, s.data(), s.size());
  len += s.size();
}

void RunOutputs::File::flush() {
  if (f && len && std::fwrite(data.get(), 1, len, f) != len) failed = true;
  len = 0;
}

bool RunOutputs::File::close() {
  if (!f) return !failed;
  flush();
  if (std::fclose(f) != 0) failed = true;
  f = nullptr;
  return !failed;
}

RunOutputs::File::~File() {
  if (f) std::fclose(f);
}

RunOutputs::RunOutputs(const std::string& dir, TraceDetail trace) : dir_(dir), detail_(trace) {
  // A folder that cannot be made or written is the user's input: exit 2, before the run.
  std::error_code ec;
  if (dir.empty()) throw InputError("--out: empty folder name");
  std::filesystem::create_directories(dir, ec);
  if (ec) throw InputError(fmt::format("--out {}: cannot create the folder: {}", dir, ec.message()));
  for (const char* f : {"summary.json", "requests.csv", "steps.csv", "trace.json", "workload.resolved.yaml"}) {
    const auto p = std::filesystem::path(dir) / f;
    if (std::filesystem::exists(p) && !std::filesystem::is_regular_file(p))
      throw InputError(fmt::format("--out {}: {} exists and is not a file", dir, p.string()));
  }
  bool ok = steps_.open(dir + "/steps.csv");
  if (detail_ != TraceDetail::None) ok = ok && trace_.open(dir + "/trace.json");
  else std::filesystem::remove(std::filesystem::path(dir) / "trace.json", ec);  // not a stale one from an earlier run
  if (!ok) throw InputError(fmt::format("--out {}: cannot write files there", dir));
  steps_.append("step,instance,start_s,elapsed_ms,n_seqs,n_prefill,n_decode,n_tokens,kv_used_blocks,kv_reserved_blocks,kv_util,"
                "waiting,running,gemm_ms,attention_ms,overhead_ms,after_idle,n_samples,attn_pairs,context_tokens,comm_ms,"
                "predicted_ms,pred_error\n");
  // The process names first, so that every later event starts with ",\n".
  if (detail_ != TraceDetail::None)
    trace_.append("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"
                  R"j({"name":"process_name","ph":"M","pid":1,"args":{"name":"instances (steps)"}},)j"
                  "\n"
                  R"j({"name":"process_name","ph":"M","pid":2,"args":{"name":"requests"}})j");
  pending_.reserve(kBatchRows);
  formatter_ = std::make_unique<StepFormatter>();
  writer_ = std::thread([this] { writer_loop(); });
}

RunOutputs::~RunOutputs() { stop_writer(); }

void RunOutputs::on_step(const StepRecord& r) {
  const StepPlan& p = *r.plan;
  const PlanFeatures f = plan_features(p);
  pending_.push_back({r.index, r.start, r.elapsed, r.cost, f.attn_pairs, f.context_tokens, r.instance,
                      int32_t(p.seqs.size()), p.num_prefill_seqs, p.num_decode_seqs, p.num_tokens, p.num_samples,
                      r.kv_used, r.kv_reserved, r.kv_capacity, r.waiting, r.running, p.after_idle});
  if (pending_.size() >= kBatchRows) submit_pending();
}

void RunOutputs::submit_pending() {
  if (pending_.empty()) return;
  std::vector<StepRow> next;
  {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return queue_.size() < kMaxQueued; });
    queue_.push_back(std::move(pending_));
    if (!spare_.empty()) {
      next = std::move(spare_.back());
      spare_.pop_back();
    }
  }
  cv_.notify_all();
  pending_ = std::move(next);
  pending_.clear();
  pending_.reserve(kBatchRows);
}

void RunOutputs::stop_writer() {
  if (!writer_.joinable()) return;
  {
    std::lock_guard lk(mu_);
    done_ = true;
  }
  cv_.notify_all();
  writer_.join();
}

void RunOutputs::writer_loop() {
  for (;;) {
    std::vector<StepRow> batch;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return !queue_.empty() || done_; });
      if (queue_.empty()) break;  // done and drained
      batch = std::move(queue_.front());
      queue_.erase(queue_.begin());
    }
    cv_.notify_all();
    // After a failure (out of memory) keep taking batches so that on_step never waits forever.
    if (!writer_error_) {
      try {
        write_rows(batch);
      } catch (...) {
        writer_error_ = std::current_exception();
      }
    }
    batch.clear();
    std::lock_guard lk(mu_);
    spare_.push_back(std::move(batch));
  }
}

void RunOutputs::write_rows(const std::vector<StepRow>& rows) {
  StepFormatter& f = *formatter_;
  const bool counters = has_requests(detail_), slices = has_steps(detail_), args = has_step_args(detail_);
  for (const StepRow& r : rows) {
    // steps.csv: "{},{},{:.9f},{:.6f},{},{},{},{},{},{},{:.6f},{},{},{:.6f},{:.6f},{:.6f},{:d},{},{:.0f},{:.0f},{:.6f},{:.6f},{:.4f}\n"
    char* p = steps_.room(kRowRoom);
    p = put_int(p, r.index);
    *p++ = ',';
    p = put_int(p, r.instance);
    *p++ = ',';
    p = put_scaled<9>(p, r.start, to_seconds(r.start));
    *p++ = ',';
    p = put_scaled<6>(p, r.elapsed, to_ms(r.elapsed));
    for (int32_t v : {r.seqs, r.prefill_seqs, r.decode_seqs, r.tokens, r.kv_used, r.kv_reserved}) {
      *p++ = ',';
      p = put_int(p, v);
    }
    *p++ = ',';
    p = f.kv_util.put(p, r.kv_capacity ? double(r.kv_used) / r.kv_capacity : 0.0);
    *p++ = ',';
    p = put_int(p, r.waiting);
    *p++ = ',';
    p = put_int(p, r.running);
    *p++ = ',';
    p = f.gemm.put(p, r.cost.gemm_s * 1e3);
    *p++ = ',';
    p = fmt::format_to(p, FMT_COMPILE("{:.6f}"), r.cost.attention_s * 1e3);
    *p++ = ',';
    p = f.overhead.put(p, r.cost.overhead_s * 1e3);
    p = r.after_idle ? put(p, ",1,") : put(p, ",0,");
    p = put_int(p, r.samples);
    *p++ = ',';
    p = put_fixed0(p, r.attn_pairs);
    *p++ = ',';
    p = put_fixed0(p, r.context_tokens);
    *p++ = ',';
    p = f.comm.put(p, r.cost.comm_s * 1e3);
    // The cost model's total beside the measured time, and its relative error (0 in simulated
    // time, where the cost model sets the step's time).
    const double predicted_ms = r.cost.total_s() * 1e3, elapsed_ms = to_ms(r.elapsed);
    const double err = elapsed_ms > 0 ? (predicted_ms - elapsed_ms) / elapsed_ms : 0.0;
    p = fmt::format_to(p, FMT_COMPILE(",{:.6f},{:.4f}\n"), predicted_ms, std::fabs(err) < 5e-5 ? 0.0 : err);
    steps_.commit(p);
    if (!counters) continue;

    // trace.json, times in µs: the step as a slice on its instance's track.
    p = trace_.room(kRowRoom);
    if (slices) {
      p = r.prefill_seqs ? put(p, ",\n{\"name\":\"prefill+decode\",\"ph\":\"X\",\"pid\":1,\"tid\":")
                         : put(p, ",\n{\"name\":\"decode\",\"ph\":\"X\",\"pid\":1,\"tid\":");
      p = put_int(p, r.instance);
      p = put(p, ",\"ts\":");
      p = put_scaled<3>(p, r.start, double(r.start) / 1e3);
      p = put(p, ",\"dur\":");
      p = put_scaled<3>(p, r.elapsed, double(r.elapsed) / 1e3);
      if (args) {
        p = put(p, ",\"args\":{\"seqs\":");
        p = put_int(p, r.seqs);
        p = put(p, ",\"tokens\":");
        p = put_int(p, r.tokens);
        p = put(p, ",\"prefill_seqs\":");
        p = put_int(p, r.prefill_seqs);
        *p++ = '}';
      }
      *p++ = '}';
    }
    // Counters only when they change: a counter holds its value until the next sample, so
    // the tracks are the same. Steps come in time order; should one not, write it anyway.
    const bool in_order = r.start >= f.last_counter_ts;
    f.last_counter_ts = std::max(f.last_counter_ts, r.start);
    if (!in_order || r.waiting != f.last_waiting || r.running != f.last_running) {
      p = put(p, ",\n{\"name\":\"state\",\"ph\":\"C\",\"pid\":1,\"ts\":");
      p = put_scaled<3>(p, r.start, double(r.start) / 1e3);
      p = put(p, ",\"args\":{\"waiting\":");
      p = put_int(p, r.waiting);
      p = put(p, ",\"running\":");
      p = put_int(p, r.running);
      p = put(p, "}}");
      f.last_waiting = r.waiting;
      f.last_running = r.running;
    }
    if (!in_order || r.kv_used != f.last_kv) {
      p = put(p, ",\n{\"name\":\"kv_used_blocks\",\"ph\":\"C\",\"pid\":1,\"ts\":");
      p = put_scaled<3>(p, r.start, double(r.start) / 1e3);
      p = put(p, ",\"args\":{\"blocks\":");
      p = put_int(p, r.kv_used);
      p = put(p, "}}");
      f.last_kv = r.kv_used;
    }
    trace_.commit(p);
  }
  steps_.maybe_flush();
  trace_.maybe_flush();
}

void RunOutputs::finish(const Engine& e, const Summary& s, const Workload& w) {
  // The writer drains the last steps while this thread writes the per-request files.
  submit_pending();
  {
    std::lock_guard lk(mu_);
    done_ = true;
  }
  cv_.notify_all();

  // requests.csv: "{},{:.9f},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n" per request, empty
  // cells where a time or latency does not apply.
  File req;
  bool req_ok = req.open(dir_ + "/requests.csv");
  req.append("id,arrival_s,first_token_s,finish_s,prompt_len,output_len,status,max_output,fail_reason,first_scheduled_s,"
             "ttft_ms,tpot_ms,e2e_ms,itl_max_ms,prefix_group,cached_tokens,output_tokens\n");
  auto seconds_or_empty = [](char* p, Time t) {
    if (t != kNever) p = put_scaled<9>(p, t, to_seconds(t));
    *p++ = ',';
    return p;
  };
  const auto& outs = e.outputs();
  for (const Request& r : e.requests()) {
    char* p = req.room(kRowRoom);
    p = put_int(p, r.id);
    *p++ = ',';
    p = put_scaled<9>(p, r.arrival, to_seconds(r.arrival));
    *p++ = ',';
    p = seconds_or_empty(p, r.first_token);
    p = seconds_or_empty(p, r.finish);
    p = fmt::format_to(p, FMT_COMPILE("{},{},{},{},{},"), r.prompt_len, r.generated, to_string(r.status), r.max_output,
                       to_string(r.fail_reason));
    p = seconds_or_empty(p, r.first_scheduled);
    if (r.first_token != kNever) p = put_scaled<6>(p, r.first_token - r.arrival, to_ms(r.first_token - r.arrival));
    *p++ = ',';
    if (r.generated > 1) p = fmt::format_to(p, FMT_COMPILE("{:.6f}"), to_ms(r.last_token - r.first_token) / (r.generated - 1));
    *p++ = ',';
    if (r.finish != kNever && r.status == RequestStatus::Finished)
      p = put_scaled<6>(p, r.finish - r.arrival, to_ms(r.finish - r.arrival));
    *p++ = ',';
    p = put_scaled<6>(p, r.itl_max, to_ms(r.itl_max));
    *p++ = ',';
    p = put_int(p, r.prefix_group);
    *p++ = ',';
    p = put_int(p, r.num_cached_tokens);
    *p++ = ',';
    req.commit(p);
    if (!outs.empty()) {  // real backends: the output token ids, space-separated
      bool first = true;
      for (Token t : outs[size_t(r.id)]) {
        p = req.room(16);
        if (!first) *p++ = ' ';
        first = false;
        req.commit(put_int(p, t));
      }
    }
    req.append("\n");
    req.maybe_flush();
  }
  req_ok = req.close() && req_ok;

  // Per-request lifetimes as async spans: queued (arrival -> first scheduled), prefill
  // (-> first token) and decode (-> finish). Kept in memory until the step events are out.
  File spans;
  if (has_requests(detail_)) {
    for (const Request& r : e.requests()) {
      auto span = [&](std::string_view name, Time a, Time b) {
        if (a == kNever || b == kNever || b < a) return;
        for (const auto& [ph, ts] : {std::pair{'b', a}, std::pair{'e', b}}) {
          char* p = spans.room(kRowRoom);
          p = fmt::format_to(p, FMT_COMPILE(",\n{{\"name\":\"{}\",\"cat\":\"request\",\"ph\":\"{}\",\"pid\":2,\"id\":{},\"ts\":"),
                             name, ph, r.id);
          p = put_scaled<3>(p, ts, double(ts) / 1e3);
          *p++ = '}';
          spans.commit(p);
        }
      };
      span("queued", r.arrival, r.first_scheduled == kNever ? r.finish : r.first_scheduled);
      span("prefill", r.first_scheduled, r.first_token);
      span("decode", r.first_token, r.finish);
    }
  }

  std::ofstream resolved(dir_ + "/workload.resolved.yaml");
  resolved << to_yaml(w);
  resolved.flush();

  stop_writer();
  if (writer_error_) std::rethrow_exception(writer_error_);
  const bool steps_ok = steps_.close();
  trace_.flush();
  if (trace_.f) {
    if (spans.len && std::fwrite(spans.data.get(), 1, spans.len, trace_.f) != spans.len) trace_.failed = true;
    trace_.append("\n]}\n");
  }
  const bool trace_ok = trace_.close();
  // summary.json last, so that its peak RSS includes writing the other files.
  Summary at_end = s;
  at_end.peak_rss_kb = std::max(s.peak_rss_kb, peak_rss_kb());
  nlohmann::json j = summary_json(at_end, w);
  std::ofstream summary(dir_ + "/summary.json");
  // Names come from the workload file: replace invalid UTF-8 rather than fail at the end.
  summary << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  summary.flush();
  if (!summary || !resolved || !req_ok || !steps_ok || !trace_ok)
    throw std::runtime_error(fmt::format("--out {}: writing the run's files failed (disk full?)", dir_));
}

ProgressReporter::ProgressReporter(int64_t total) : enabled_(isatty(STDERR_FILENO) == 1), total_(total) {
  last_print_ = wall_seconds();
}

ProgressReporter::~ProgressReporter() {
  if (printed_) fmt::print(stderr, "\n");
}

void ProgressReporter::on_step(const StepRecord& r) {
  if (!enabled_ || (r.index & 255) != 0) return;
  const double now = wall_seconds();
  if (now - last_print_ < 0.5) return;
  last_print_ = now;
  printed_ = true;
  fmt::print(stderr, "\r[tandem] t={:.1f}s  done {}/{}  running {}  waiting {}   ", to_seconds(r.start), done_, total_,
             r.running, r.waiting);
}

}  // namespace tandem
