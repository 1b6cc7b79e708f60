// The schema of what a run reports: summary.json's keys and the stdout summary table.
#include "sim/outputs/outputs_schema.h"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include "core/error.h"

namespace tandem {

namespace {
// A figure that may be unknown: null then, never a made-up number.
nlohmann::json optional_number(const std::optional<double>& x) {
  return x ? nlohmann::json(*x) : nlohmann::json(nullptr);
}
nlohmann::json pct_json(const Percentiles& p) {
  return {{"mean", p.mean}, {"p50", p.p50},    {"p90", p.p90}, {"p99", p.p99},
          {"max", p.max},   {"std", p.stddev}, {"count", p.n}};
}
}  // namespace

nlohmann::json summary_json(const Summary& s, const Workload& w) {
  nlohmann::json j;
  j["workload"] = s.workload;
  j["workload_path"] = w.path;
  j["policy"] = s.policy;
  j["backend"] = s.backend;
  if (!s.clock.empty()) j["clock"] = s.clock;
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
  // The load offered beside the one configured: a drawn process offers a few % off its rate.
  j["arrival"] = {{"configured_rate", s.configured_rate > 0 ? nlohmann::json(s.configured_rate) : nlohmann::json()},
                  {"offered_rate", s.offered_rate},
                  {"normalized", s.arrival_normalized}};
  j["requests"] = {{"total", s.total},
                   {"finished", s.finished},
                   {"failed", s.failed},
                   {"cancelled", s.cancelled},
                   {"failed_by_reason", s.failed_by_reason}};
  j["jitter_ms"] = s.jitter_ms;
  // How often decodes shared their step with prefill work (a whole prompt or a chunk).
  j["steps_mix"] = {{"decode_steps", s.decode_steps},
                    {"decode_steps_with_prefill", s.decode_steps_with_prefill},
                    {"decode_steps_with_prefill_share", s.decode_steps_with_prefill_share}};
  j["engine"] = {{"enable_chunked_prefill", w.engine.enable_chunked_prefill},
                 {"max_num_batched_tokens", w.engine.max_num_batched_tokens},
                 {"max_num_partial_prefills", w.engine.max_num_partial_prefills},
                 {"step_composition", std::string(to_string(w.engine.step_composition))},
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
  if (s.instances.size() <= 1) {
    j["kv_cache"] = {{"blocks", s.kv_blocks},
                     {"block_size", w.engine.block_size},
                     {"mean_util", s.kv_mean_util},
                     {"peak_util", s.kv_peak_util}};
  } else {
    // Each instance has its own pool: its use is a figure of its own, never mixed with another's.
    nlohmann::json per = nlohmann::json::array();
    for (const InstanceFigures& f : s.instances)
      per.push_back({{"id", f.id},
                     {"role", f.role},
                     {"blocks", f.kv_blocks},
                     {"mean_util", f.kv_mean_util},
                     {"peak_util", f.kv_peak_util}});
    j["kv_cache"] = {{"blocks", s.kv_blocks}, {"block_size", w.engine.block_size}, {"instances", per}};
  }
  if (s.has_slo)
    j["goodput"] = {{"slo_ttft_ms", s.slo_ttft_ms},
                    {"slo_tpot_ms", s.slo_tpot_ms},
                    {"requests_per_s", s.goodput_requests_per_s},
                    {"fraction", s.goodput_fraction}};
  if (s.has_slo) j["attainment"] = attainment_json(s.attainment);
  if (!s.instances.empty()) {
    nlohmann::json in = nlohmann::json::array();
    for (const InstanceFigures& f : s.instances)
      in.push_back({{"id", f.id},
                    {"role", f.role},
                    {"kv_blocks", f.kv_blocks},
                    {"steps", f.steps},
                    {"kv_mean_util", f.kv_mean_util},
                    {"kv_peak_util", f.kv_peak_util},
                    {"busy_s", f.busy_s},
                    {"busy_fraction", f.busy_fraction},
                    {"model_flops", f.model_flops},
                    {"mfu", optional_number(f.mfu)}});
    j["instances"] = in;
  }
  // MFU: null where the peak FLOP/s are unknown (no GPU, a fitted or profiled hardware).
  const Utilisation& u = s.utilisation;
  j["utilisation"] = {
      {"model_flops", u.model_flops},
      {"gpus", u.gpus},
      {"peak_tflops_per_gpu",
       optional_number(u.peak_flops_per_gpu ? std::optional(*u.peak_flops_per_gpu / 1e12) : std::nullopt)},
      {"mfu", optional_number(u.mfu)}};
  j["layout"] = layout_json(s.layout);
  if (const DisaggregationFigures& d = s.disaggregation; d.enabled)
    j["disaggregation"] = {
        {"channel", d.channel},
        {"first_token_from", s.layout.first_token_from},
        {"transfers",
         {{"started", d.started},
          {"delivered", d.delivered},
          {"failed", d.failed},
          {"failed_by_cause",
           {{"error", d.failed_error}, {"corrupt", d.failed_corrupt}, {"partial", d.failed_partial}}},
          {"timed_out", d.timed_out},
          {"aborted", d.aborted},
          {"stale_completions", d.stale},
          {"in_flight_at_failure", d.lost},
          {"cancelled_before_transfer", d.cancelled_parked}}},
        {"cancels",
         {{"prefill", d.cancelled_prefill},
          {"parked", d.cancelled_parked},
          {"transfer", d.cancelled_transfer},
          {"received", d.cancelled_received},
          {"decode", d.cancelled_decode}}},
        {"bytes", d.bytes},
        {"transfer_ms", pct_json(d.transfer_ms)},
        {"handoff_wait_ms", pct_json(d.handoff_wait_ms)},
        {"ttft_after_transfer_ms", pct_json(d.ttft_after_transfer_ms)}};
  if (const auto& c = s.conditions) {  // measured runs only
    const auto known = [](double x) { return x < 0 ? nlohmann::json(nullptr) : nlohmann::json(x); };
    j["conditions"] = {{"load_average_start", known(c->load_start)},
                       {"load_average_end", known(c->load_end)},
                       {"cores", c->cores},
                       {"cores_used", c->cores_used},
                       {"others_share", known(c->others)},
                       {"steal_share", known(c->steal)},
                       {"cores_taken_share", known(c->taken)},
                       {"cores_taken_warn_above", kTakenWarn},
                       {"seconds", c->wall_s}};
    j["warnings"] = s.warnings;
  }
  j["steps"] = s.steps;
  j["makespan_s"] = s.makespan_s;
  j["sim_s"] = s.sim_s;
  j["wall_s"] = s.wall_s;
  j["peak_rss_mb"] = double(s.peak_rss_kb) / 1024.0;
  return j;
}

nlohmann::json layout_json(const RunLayout& l) {
  nlohmann::json in = nlohmann::json::array();
  for (const InstanceLayout& i : l.instances) {
    nlohmann::json one = {{"id", i.id}, {"role", i.role}, {"backend", i.backend},
                          {"tp", i.tp}, {"gpus", i.gpus}, {"kv_blocks", i.kv_blocks}};
    if (i.first_gpu >= 0) one["first_gpu"] = i.first_gpu;
    in.push_back(one);
  }
  return {{"instances", in},
          {"num_instances", l.instances.size()},
          {"num_ranks", l.num_ranks()},
          {"num_gpus", l.num_gpus()},
          {"data_parallel", l.data_parallel},
          {"disaggregation", l.disaggregation},
          {"channel", l.channel.empty() ? nlohmann::json(nullptr) : nlohmann::json(l.channel)},
          {"first_token_from", l.first_token_from}};
}

namespace {
// A layout object's field, or a default where absent or of another type (files written by hand).
int64_t layout_int(const nlohmann::json& l, const char* key) {
  return l.is_object() && l.contains(key) && l[key].is_number_integer() ? l[key].get<int64_t>() : 0;
}
std::string layout_str(const nlohmann::json& l, const char* key) {
  return l.is_object() && l.contains(key) && l[key].is_string() ? l[key].get<std::string>() : "";
}
bool known_layout(const nlohmann::json& l) {
  return l.is_object() && l.contains("instances") && l["instances"].is_array() && !l["instances"].empty() &&
         layout_int(l, "num_instances") > 0;
}
bool layout_bool(const nlohmann::json& l, const char* key) {
  return l.is_object() && l.contains(key) && l[key].is_boolean() && l[key].get<bool>();
}
std::string plural(int64_t n, std::string_view one, std::string_view many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}
// "2 GPUs", or "2 CPU ranks" where the run holds no GPU.
std::string hardware_text(const nlohmann::json& l) {
  const int64_t gpus = layout_int(l, "num_gpus");
  return gpus > 0 ? plural(gpus, "GPU", "GPUs") : plural(layout_int(l, "num_ranks"), "CPU rank", "CPU ranks");
}
}  // namespace

std::string layout_text(const nlohmann::json& l) {
  if (!known_layout(l)) return "layout unknown";
  const nlohmann::json& in = l["instances"];
  const auto tp_of = [](const nlohmann::json& i) {
    return i.contains("tp") && i["tp"].is_number() ? i["tp"].get<int64_t>() : 1;
  };
  const auto role_of = [](const nlohmann::json& i) {
    return i.contains("role") && i["role"].is_string() ? i["role"].get<std::string>() : std::string("?");
  };
  if (layout_bool(l, "disaggregation")) {
    std::string parts;
    for (const nlohmann::json& i : in) {
      if (!parts.empty()) parts += " + ";
      parts += fmt::format("{} TP {}", role_of(i), tp_of(i));
      const std::string b = i.contains("backend") && i["backend"].is_string() ? i["backend"].get<std::string>() : "";
      if (const size_t at = b.find('@'); at != std::string::npos) parts += " at " + b.substr(at + 1);
    }
    const std::string ch = layout_str(l, "channel");
    return fmt::format("1P1D ({}, {} channel), {}", parts, ch.empty() ? "?" : ch, hardware_text(l));
  }
  if (in.size() == 1) {
    const int64_t tp = tp_of(in[0]);
    return fmt::format("1 instance{}, {}", tp > 1 ? fmt::format(" (TP {})", tp) : "", hardware_text(l));
  }
  return fmt::format("{} colocated replicas (data_parallel, TP {} each), {}", in.size(), tp_of(in[0]),
                     hardware_text(l));
}

std::string layout_brief(const nlohmann::json& l) {
  if (!known_layout(l)) return "unknown";
  const int64_t n = layout_int(l, "num_instances");
  if (layout_bool(l, "disaggregation"))
    return fmt::format("1P1D, {}, TTFT@{}", hardware_text(l),
                       layout_str(l, "first_token_from") == "decode" ? "D" : "P");
  return n == 1 ? hardware_text(l) : fmt::format("dp{}, {}", n, hardware_text(l));
}

std::string first_token_text(const nlohmann::json& l) {
  const std::string from = layout_str(l, "first_token_from");
  if (from == "prefill") return "the prefill instance's first token, streamed before the KV transfer";
  if (from == "decode") return "the first token as the decode instance streams it, once the KV has arrived";
  if (from == "colocated") return "the first token, as the instance that computed the prompt samples it";
  return "unknown (a summary.json from before tandem recorded where the first token came from)";
}

// summary.json's `attainment`: each bound the workload sets, then both, over every request.
nlohmann::json attainment_json(const Attainment& a) {
  nlohmann::json j = {{"denominator", "all requests; failed, cancelled and unfinished ones count as misses"},
                      {"requests", a.requests},
                      {"not_finished", a.not_finished}};
  if (a.has_ttft) j["ttft"] = {{"slo_ms", a.slo_ttft_ms}, {"met", a.ttft_met}, {"fraction", a.ttft}};
  if (a.has_tpot) j["tpot"] = {{"slo_ms", a.slo_tpot_ms}, {"met", a.tpot_met}, {"fraction", a.tpot}};
  j["both"] = {{"met", a.both_met}, {"fraction", a.both}};
  return j;
}

std::string attainment_text(const Attainment& a) {
  std::string s = fmt::format("SLO attainment over all {} requests ({} not finished count as misses):", a.requests,
                              a.not_finished);
  if (a.has_ttft) s += fmt::format(" TTFT<={}ms {:.1f}% ({})", a.slo_ttft_ms, 100 * a.ttft, a.ttft_met);
  if (a.has_tpot) s += fmt::format("{} TPOT<={}ms {:.1f}% ({})", a.has_ttft ? "," : "", a.slo_tpot_ms, 100 * a.tpot, a.tpot_met);
  if (a.has_ttft && a.has_tpot) s += fmt::format(", both {:.1f}% ({})", 100 * a.both, a.both_met);
  return s;
}

void print_summary(std::ostream& os, const Summary& s) {
  fmt::print(os, "workload {}  policy {}  backend {}\n", s.workload, s.policy, s.backend);
  const nlohmann::json layout = layout_json(s.layout);
  fmt::print(os, "layout {}; TTFT counts {}\n", layout_text(layout), first_token_text(layout));
  if (s.configured_rate > 0)
    fmt::print(os, "arrival rate {:.4g} req/s configured, {:.4g} offered ({} requests by the last arrival{})\n",
               s.configured_rate, s.offered_rate, s.total, s.arrival_normalized ? ", normalized" : "");
  else
    fmt::print(os, "arrival rate {:.4g} req/s offered ({} requests by the last arrival)\n", s.offered_rate, s.total);
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
  if (s.has_slo) fmt::print(os, "{}\n", attainment_text(s.attainment));
  if (s.instances.size() <= 1)
    fmt::print(os, "KV cache {} blocks: mean use {:.1f}%, peak {:.1f}%   jitter {:.2f} ms\n", s.kv_blocks,
               100 * s.kv_mean_util, 100 * s.kv_peak_util, s.jitter_ms);
  else
    fmt::print(os, "KV cache {} blocks in {} pools (use per instance below)   jitter {:.2f} ms\n", s.kv_blocks,
               s.instances.size(), s.jitter_ms);
  fmt::print(os, "decode steps {}: {:.1f}% also carried prefill tokens\n", s.decode_steps,
             100 * s.decode_steps_with_prefill_share);
  if (s.prefix_enabled)
    fmt::print(os,
               "prefix cache: hit rate {:.1f}% of prompt tokens ({:.1f}% of full blocks), {} of {} requests hit, {} "
               "evictions\n",
               100 * s.prefix_hit_rate, 100 * s.prefix_block_hit_rate, s.prefix_hits, s.prefix_queries,
               s.prefix_evictions);
  else if (!s.prefix_off_reason.empty())
    fmt::print(os, "prefix cache: off ({})\n", s.prefix_off_reason);
  else
    fmt::print(os, "prefix cache: off\n");
  if (s.instances.size() > 1)
    for (const InstanceFigures& f : s.instances)
      fmt::print(os, "instance {} ({}): {} steps, busy {:.1f}%, KV {} blocks, mean use {:.1f}%, peak {:.1f}%\n", f.id,
                 f.role, f.steps, 100 * f.busy_fraction, f.kv_blocks, 100 * f.kv_mean_util, 100 * f.kv_peak_util);
  if (const DisaggregationFigures& d = s.disaggregation; d.enabled) {
    // The causes only when something failed: a clean run's line stays as it was.
    const std::string causes = d.failed > 0 ? fmt::format(" ({} error, {} corrupt, {} partial)", d.failed_error,
                                                          d.failed_corrupt, d.failed_partial)
                                            : "";
    const std::string timed_out = d.timed_out > 0 ? fmt::format(", {} timed out", d.timed_out) : "";
    fmt::print(os,
               "disaggregation ({} channel): {} transfers started, {} delivered, {} failed{}{}, {} aborted; {:.1f} MB "
               "moved; first token from the {} instance\n",
               d.channel, d.started, d.delivered, d.failed, causes, timed_out, d.aborted, double(d.bytes) / 1e6,
               s.layout.first_token_from);
    row("xfer ms", d.transfer_ms);
    row("TTFT@D ms", d.ttft_after_transfer_ms);
  }
  fmt::print(os, "steps {}  simulated {:.3f} s  wall {:.3f} s  peak RSS {:.0f} MB\n", s.steps, s.sim_s, s.wall_s,
             double(s.peak_rss_kb) / 1024.0);
  if (s.conditions) fmt::print(os, "measured under: {}\n", conditions_text(*s.conditions));
  for (const std::string& w : s.warnings) fmt::print(os, "WARNING: {}\n", w);
}

TraceDetail parse_trace_detail(const std::string& s) {
  if (s == "full") return TraceDetail::Full;
  if (s == "steps") return TraceDetail::Steps;
  if (s == "requests") return TraceDetail::Requests;
  if (s == "none") return TraceDetail::None;
  throw InputError(fmt::format("--trace {}: expected none, requests, steps or full", s));
}

}  // namespace tandem
