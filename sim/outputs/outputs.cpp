#include "sim/outputs/outputs.h"

#include "sim/base/number_format.h"

#include "backend/cost_model.h"
#include "sim/workload/config.h"
#include "sim/outputs/outputs_vllm.h"

#include <fmt/compile.h>
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <stdexcept>
#include <string_view>
#include <utility>

namespace tandem {

namespace {
constexpr size_t kBatchRows = 4096;  // steps handed to the writer at a time
constexpr size_t kMaxQueued = 32;    // batches in flight before on_step waits for the writer

// Each level holds the one before it.
bool has_requests(TraceDetail d) { return d >= TraceDetail::Requests; }  // and the counters
bool has_steps(TraceDetail d) { return d >= TraceDetail::Steps; }
bool has_step_args(TraceDetail d) { return d >= TraceDetail::Full; }

}  // namespace

using namespace numfmt;

// The writer thread's state for the step rows.
struct RunOutputs::StepFormatter {
  // Sized by the miss rates on a long replay (the Azure conversation hour): KV use and the GEMM
  // term repeat a few thousand distinct values, overhead and communication are constant; the
  // attention term is new almost every step, so it is formatted each time. The figures:
  // reports/before-stage4/report.md, "Figures moved from code comments".
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

RunOutputs::RunOutputs(const std::string& dir, TraceDetail trace, const RunLayout* layout) : dir_(dir), detail_(trace) {
  if (layout && layout->instances.size() > 1)
    for (const InstanceLayout& in : layout->instances) roles_.push_back(in.role);
  // A folder that cannot be made or written is the user's input: exit 2, before the run.
  std::error_code ec;
  if (dir.empty()) throw InputError("--out: empty folder name");
  std::filesystem::create_directories(dir, ec);
  if (ec) throw InputError(fmt::format("--out {}: cannot create the folder: {}", dir, ec.message()));
  for (const char* f :
       {"summary.json", "requests.csv", "steps.csv", "trace.json", "workload.resolved.yaml", "vllm_result.json"}) {
    const auto p = std::filesystem::path(dir) / f;
    if (std::filesystem::exists(p) && !std::filesystem::is_regular_file(p))
      throw InputError(fmt::format("--out {}: {} exists and is not a file", dir, p.string()));
  }
  bool ok = steps_.open(dir + "/steps.csv");
  if (detail_ != TraceDetail::None)
    ok = ok && trace_.open(dir + "/trace.json");
  else
    std::filesystem::remove(std::filesystem::path(dir) / "trace.json", ec);  // not a stale one from an earlier run
  if (!ok) throw InputError(fmt::format("--out {}: cannot write files there", dir));
  if (roles_.empty()) {
    steps_.append(kStepsCsvHeader);
  } else {  // the header with ",role" before its newline
    const std::string_view h = kStepsCsvHeader;
    steps_.append(h.substr(0, h.size() - 1));
    steps_.append(fmt::format(",{}\n", kStepsCsvRoleColumn));
  }
  // The process names first, so that every later event starts with ",\n".
  if (detail_ != TraceDetail::None) {
    trace_.append(
        "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"
        R"j({"name":"process_name","ph":"M","pid":1,"args":{"name":"instances (steps)"}},)j"
        "\n"
        R"j({"name":"process_name","ph":"M","pid":2,"args":{"name":"requests"}})j");
    // Each instance's track named by its role (and TP), so that P's and D's steps read as such.
    if (layout)
      for (const InstanceLayout& in : layout->instances)
        trace_.append(
            fmt::format(",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":{},\"args\":{{\"name\":"
                        "\"instance {} ({}, TP {})\"}}}}",
                        in.id, in.id, in.role, in.tp));
  }
  pending_.reserve(kBatchRows);
  formatter_ = std::make_unique<StepFormatter>();
  // vLLM keeps its per-request arrays only with --save-detailed: so does --trace none, which
  // asks for small outputs (the ITL arrays are per token, larger than requests.csv).
  vllm_ = std::make_unique<VllmResult>(dir, detail_ != TraceDetail::None);
  writer_ = std::thread([this] { writer_loop(); });
}

RunOutputs::~RunOutputs() { stop_writer(); }

void RunOutputs::on_step(const StepRecord& r) {
  const StepPlan& p = *r.plan;
  const PlanFeatures f = plan_features(p);
  pending_.push_back({r.index, r.start, r.elapsed, r.host, r.cost, f.attn_pairs, f.context_tokens, r.instance,
                      int32_t(p.seqs.size()), p.num_prefill_seqs, p.num_decode_seqs, p.num_tokens, p.num_samples,
                      r.kv_used, r.kv_reserved, r.kv_capacity, r.waiting, r.running, p.after_idle});
  if (pending_.size() >= kBatchRows) submit_pending();
  vllm_->on_step(r);
}

void RunOutputs::on_request_done(const Request& r) { vllm_->on_request_done(r); }

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
    // steps.csv:
    // "{},{},{:.9f},{:.6f},{},{},{},{},{},{},{:.6f},{},{},{:.6f},{:.6f},{:.6f},{:d},{},{:.0f},{:.0f},{:.6f},{:.6f},{:.4f}\n"
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
    p = fmt::format_to(p, FMT_COMPILE(",{:.6f},{:.4f},"), predicted_ms, std::fabs(err) < 5e-5 ? 0.0 : err);
    if (r.host >= 0) p = put_scaled<6>(p, r.host, to_ms(r.host));  // empty where not measured
    if (!roles_.empty()) {
      *p++ = ',';
      // Both arms string_views: a std::string arm would make the other a temporary std::string
      // that dies before the copy below (ASan: stack-use-after-scope).
      const std::string_view role =
          size_t(r.instance) < roles_.size() ? std::string_view(roles_[size_t(r.instance)]) : std::string_view("?");
      std::memcpy(p, role.data(), role.size());
      p += role.size();
    }
    *p++ = '\n';
    steps_.commit(p);
    if (!counters) continue;

    // trace.json, times in µs: the step as a slice on its instance's track.
    p = trace_.room(kRowRoom);
    if (slices) {
      // Named by what the step carried: prompt tokens only, decodes only, or both.
      p = !r.prefill_seqs ? put(p, ",\n{\"name\":\"decode\",\"ph\":\"X\",\"pid\":1,\"tid\":")
          : r.decode_seqs ? put(p, ",\n{\"name\":\"prefill+decode\",\"ph\":\"X\",\"pid\":1,\"tid\":")
                          : put(p, ",\n{\"name\":\"prefill\",\"ph\":\"X\",\"pid\":1,\"tid\":");
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
  const bool pd = e.topology().moves_kv();
  req.append(pd ? kRequestsCsvPdHeader : kRequestsCsvHeader);
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
    if (r.generated > 1)
      p = fmt::format_to(p, FMT_COMPILE("{:.6f}"), to_ms(r.last_token - r.first_token) / (r.generated - 1));
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
    if (pd) {
      const RequestTransfer t = e.topology().transfer_of(r.id);
      p = seconds_or_empty(p, t.start);
      p = seconds_or_empty(p, t.end);
      if (t.start != kNever && t.end != kNever) p = put_scaled<6>(p, t.end - t.start, to_ms(t.end - t.start));
      *p++ = ',';
      p = put_int(p, t.bytes);
      *p++ = ',';
    }
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
          p = fmt::format_to(
              p, FMT_COMPILE(",\n{{\"name\":\"{}\",\"cat\":\"request\",\"ph\":\"{}\",\"pid\":2,\"id\":{},\"ts\":"),
              name, ph, r.id);
          p = put_scaled<3>(p, ts, double(ts) / 1e3);
          *p++ = '}';
          spans.commit(p);
        }
      };
      // 1P1D: P's first token is sampled when the request parks (with first_token_from: decode
      // the client's first token, r.first_token, comes later).
      const RequestTransfer t = pd ? e.topology().transfer_of(r.id) : RequestTransfer{};
      const Time sampled = t.parked != kNever ? t.parked : r.first_token;
      span("queued", r.arrival, r.first_scheduled == kNever ? r.finish : r.first_scheduled);
      span("prefill", r.first_scheduled, sampled);
      if (t.start != kNever) {  // 1P1D: waits for a seat, moves, then decodes
        span("handoff_wait", sampled, t.start);
        span("transfer", t.start, t.end);
        span("decode", t.end, r.finish);
      } else {
        span("decode", r.first_token, r.finish);
      }
    }
  }

  std::ofstream resolved(dir_ + "/workload.resolved.yaml");
  resolved << to_yaml(w);
  resolved.flush();
  const bool vllm_ok = vllm_->write(e, s, w);

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
  if (!summary || !resolved || !req_ok || !steps_ok || !trace_ok || !vllm_ok)
    throw std::runtime_error(fmt::format("--out {}: writing the run's files failed (disk full?)", dir_));
}

}  // namespace tandem
