#include "sim/outputs.h"

#include "backend/cost_model.h"
#include "sim/config.h"

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <stdexcept>

namespace tandem {

namespace {
nlohmann::json pct_json(const Percentiles& p) {
  return {{"mean", p.mean}, {"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}, {"count", p.n}};
}
std::string seconds_or_empty(Time t) { return t == kNever ? "" : fmt::format("{:.9f}", to_seconds(t)); }
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
  j["prefix_cache"] = {{"hit_rate", s.prefix_hit_rate}, {"hit_tokens", s.prefix_hit_tokens},
                       {"queried_tokens", s.prefix_queried_tokens}};
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
  fmt::print(os, "{:<10}{:>12}{:>12}{:>12}{:>12}\n", "metric", "mean", "p50", "p90", "p99");
  auto row = [&](const char* name, const Percentiles& p) {
    fmt::print(os, "{:<10}{:>12.2f}{:>12.2f}{:>12.2f}{:>12.2f}\n", name, p.mean, p.p50, p.p90, p.p99);
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
  fmt::print(os, "steps {}  simulated {:.3f} s  wall {:.3f} s  peak RSS {:.0f} MB\n", s.steps, s.sim_s, s.wall_s,
             double(s.peak_rss_kb) / 1024.0);
}

RunOutputs::RunOutputs(const std::string& dir) : dir_(dir) {
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
  steps_.open(dir + "/steps.csv");
  trace_.open(dir + "/trace.json");
  if (!steps_ || !trace_) throw InputError(fmt::format("--out {}: cannot write files there", dir));
  steps_ << "step,instance,start_s,elapsed_ms,n_seqs,n_prefill,n_decode,n_tokens,kv_used_blocks,kv_reserved_blocks,kv_util,waiting,running,"
            "gemm_ms,attention_ms,overhead_ms,after_idle,n_samples,attn_pairs,context_tokens,comm_ms\n";
  trace_ << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
}

void RunOutputs::trace_event(const nlohmann::json& ev) {
  if (!first_trace_event_) trace_ << ",\n";
  first_trace_event_ = false;
  trace_ << ev.dump();
}

void RunOutputs::on_step(const StepRecord& r) {
  const StepPlan& p = *r.plan;
  const PlanFeatures f = plan_features(p);
  fmt::print(steps_, "{},{},{:.9f},{:.6f},{},{},{},{},{},{},{:.6f},{},{},{:.6f},{:.6f},{:.6f},{:d},{},{:.0f},{:.0f},{:.6f}\n", r.index, r.instance,
             to_seconds(r.start), to_ms(r.elapsed), p.seqs.size(), p.n_prefill_seqs, p.n_decode_seqs, p.n_tokens,
             r.kv_used, r.kv_reserved, r.kv_capacity ? double(r.kv_used) / r.kv_capacity : 0.0, r.waiting, r.running,
             r.cost.gemm_s * 1e3, r.cost.attention_s * 1e3, r.cost.overhead_s * 1e3, p.after_idle, p.n_samples,
             f.attn_pairs, f.context_tokens, r.cost.comm_s * 1e3);
  // Per-step trace events have a fixed shape with numbers only: written with fmt rather
  // than built as JSON objects, since this runs once per step (8 us a step saved).
  const double ts_us = double(r.start) / 1e3;
  if (!first_trace_event_) trace_ << ",\n";
  first_trace_event_ = false;
  fmt::print(trace_,
             "{{\"name\":\"{}\",\"ph\":\"X\",\"pid\":1,\"tid\":{},\"ts\":{:.3f},\"dur\":{:.3f},"
             "\"args\":{{\"seqs\":{},\"tokens\":{},\"prefill_seqs\":{}}}}},\n"
             "{{\"name\":\"state\",\"ph\":\"C\",\"pid\":1,\"ts\":{:.3f},\"args\":{{\"waiting\":{},\"running\":{}}}}},\n"
             "{{\"name\":\"kv_used_blocks\",\"ph\":\"C\",\"pid\":1,\"ts\":{:.3f},\"args\":{{\"blocks\":{}}}}}",
             p.n_prefill_seqs ? "prefill+decode" : "decode", r.instance, ts_us, double(r.elapsed) / 1e3, p.seqs.size(),
             p.n_tokens, p.n_prefill_seqs, ts_us, r.waiting, r.running, ts_us, r.kv_used);
}

void RunOutputs::finish(const Engine& e, const Summary& s, const Workload& w) {
  // Per-request lifetimes as async spans: queued (arrival -> first scheduled), prefill
  // (-> first token) and decode (-> finish).
  for (const Request& r : e.requests()) {
    auto span = [&](const char* name, Time a, Time b) {
      if (a == kNever || b == kNever || b < a) return;
      trace_event({{"name", name}, {"cat", "request"}, {"ph", "b"}, {"pid", 2}, {"id", r.id}, {"ts", double(a) / 1e3}});
      trace_event({{"name", name}, {"cat", "request"}, {"ph", "e"}, {"pid", 2}, {"id", r.id}, {"ts", double(b) / 1e3}});
    };
    span("queued", r.arrival, r.first_scheduled == kNever ? r.finish : r.first_scheduled);
    span("prefill", r.first_scheduled, r.first_token);
    span("decode", r.first_token, r.finish);
  }
  trace_event({{"name", "process_name"}, {"ph", "M"}, {"pid", 1}, {"args", {{"name", "instances (steps)"}}}});
  trace_event({{"name", "process_name"}, {"ph", "M"}, {"pid", 2}, {"args", {{"name", "requests"}}}});
  trace_ << "\n]}\n";
  trace_.flush();
  steps_.flush();

  std::ofstream req(dir_ + "/requests.csv");
  req << "id,arrival_s,first_token_s,finish_s,prompt_len,output_len,status,max_output,fail_reason,first_scheduled_s,"
         "ttft_ms,tpot_ms,e2e_ms,itl_max_ms,prefix_group,output_tokens\n";
  const auto& outs = e.outputs();
  for (const Request& r : e.requests()) {
    const bool tok = r.first_token != kNever;
    std::string ids;
    if (!outs.empty())
      for (Token t : outs[size_t(r.id)]) ids.append(ids.empty() ? "" : " ").append(std::to_string(t));
    fmt::print(req, "{},{:.9f},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", r.id, to_seconds(r.arrival),
               seconds_or_empty(r.first_token), seconds_or_empty(r.finish), r.prompt_len, r.generated,
               to_string(r.status), r.max_output, to_string(r.fail_reason), seconds_or_empty(r.first_scheduled),
               tok ? fmt::format("{:.6f}", to_ms(r.first_token - r.arrival)) : "",
               r.generated > 1 ? fmt::format("{:.6f}", to_ms(r.last_token - r.first_token) / (r.generated - 1)) : "",
               r.finish != kNever && r.status == RequestStatus::Finished ? fmt::format("{:.6f}", to_ms(r.finish - r.arrival)) : "",
               fmt::format("{:.6f}", to_ms(r.itl_max)), r.prefix_group, ids);
  }
  nlohmann::json j = summary_json(s, w);
  std::ofstream summary(dir_ + "/summary.json"), resolved(dir_ + "/workload.resolved.yaml");
  // Names come from the workload file: replace invalid UTF-8 rather than fail at the end.
  summary << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  resolved << to_yaml(w);
  req.flush();
  if (!summary || !resolved || !req || !steps_.good() || !trace_.good())
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
