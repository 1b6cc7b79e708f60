#include "serve/metrics_text.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace tandem::serve {

namespace {
void metric(std::string& out, const char* name, const char* type, const char* help, const std::string& labels,
            double value) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{{{}}} {}\n", name, help, name, type, name, labels, value);
}

void histogram(std::string& out, const char* name, const char* help, const std::string& labels,
               const LiveStats::Histogram& h) {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  int64_t cumulative = 0;
  for (size_t i = 0; i < h.counts.size(); ++i) {
    cumulative += h.counts[i];
    const std::string le = i < h.bounds.size() ? fmt::format("{}", h.bounds[i]) : "+Inf";
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, le, cumulative);
  }
  out += fmt::format("{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, labels, h.sum, name, labels, h.count);
}
}  // namespace

std::string metrics_text(LiveStats& s, const std::string& model) {
  // A label value is a JSON-like quoted string: the model name escaped as JSON escapes it.
  const std::string labels = "model_name=" + nlohmann::json(model).dump();
  std::string out;
  metric(out, "vllm:num_requests_running", "gauge", "Requests in the running batches.", labels, double(s.running));
  metric(out, "vllm:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", labels, double(s.waiting));
  metric(out, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage (1 = full), the fullest instance.", labels,
         s.kv_usage.load());
  metric(out, "vllm:gpu_cache_usage_perc", "gauge", "KV-cache usage (1 = full); vLLM's older name.", labels,
         s.kv_usage.load());
  std::lock_guard lock(s.mu);
  metric(out, "vllm:prefix_cache_queries_total", "counter",
         "Prompt tokens looked up in the prefix cache (counted at a prompt's first token).", labels,
         double(s.prefix_queries));
  metric(out, "vllm:prefix_cache_hits_total", "counter", "Prompt tokens served from the prefix cache.", labels,
         double(s.prefix_hits));
  metric(out, "vllm:prompt_tokens_total", "counter",
         "Prompt tokens of the prompts done (counted at their first token).", labels, double(s.prompt_tokens));
  metric(out, "vllm:generation_tokens_total", "counter", "Tokens generated.", labels, double(s.generation_tokens));
  // vLLM counts a request's end by its finish reason; an aborted (cancelled) one as "abort".
  out += fmt::format(
      "# HELP vllm:request_success_total Requests ended, by finish reason (tandem ignores EOS: every finished one "
      "by length; abort: cancelled).\n# TYPE vllm:request_success_total counter\n"
      "vllm:request_success_total{{{},finished_reason=\"length\"}} {}\n"
      "vllm:request_success_total{{{},finished_reason=\"abort\"}} {}\n",
      labels, s.finished, labels, s.cancelled);
  metric(out, "vllm:num_preemptions_total", "counter",
         "Preemptions: always 0, tandem never preempts (admission reserves a request's KV for its life).", labels, 0.0);
  metric(out, "tandem:requests_cancelled_total", "counter", "Requests cancelled (a client left, or a shutdown).",
         labels, double(s.cancelled));
  metric(out, "tandem:requests_failed_total", "counter", "Requests failed, with a reason.", labels, double(s.failed));
  metric(out, "tandem:kv_transfers_total", "counter", "KV transfers from prefill to decode (PD).", labels,
         double(s.transfers));
  metric(out, "tandem:kv_transfer_bytes_total", "counter", "KV bytes moved from prefill to decode (PD).", labels,
         double(s.transfer_bytes));
  histogram(out, "vllm:time_to_first_token_seconds", "Time to first token.", labels, s.ttft);
  histogram(out, "vllm:inter_token_latency_seconds", "Time between two tokens of a request.", labels, s.itl);
  histogram(out, "vllm:e2e_request_latency_seconds", "A finished request's time from arrival to its end.", labels,
            s.e2e);
  histogram(out, "vllm:request_queue_time_seconds", "A finished request's time from arrival to its first step.", labels,
            s.queue);
  histogram(out, "vllm:request_prefill_time_seconds",
            "A finished request's time from its first step to its first token.", labels, s.prefill);
  histogram(out, "vllm:request_decode_time_seconds", "A finished request's time from its first to its last token.",
            labels, s.decode);
  histogram(out, "vllm:request_inference_time_seconds",
            "A finished request's time from its first step to its last token (prefill + decode).", labels, s.inference);
  histogram(out, "vllm:request_time_per_output_token_seconds",
            "A finished request's decode time over its tokens after the first (two tokens or more).", labels,
            s.request_tpot);
  histogram(out, "vllm:request_prompt_tokens", "A finished request's prompt tokens.", labels, s.prompt_len);
  histogram(out, "vllm:request_generation_tokens", "A finished request's generated tokens.", labels, s.generation_len);
  histogram(out, "vllm:request_params_max_tokens", "A finished request's max_tokens.", labels, s.max_tokens_param);
  histogram(out, "vllm:iteration_tokens_total",
            "Tokens an engine step computes (prompt chunks and decode inputs), every instance's steps.", labels,
            s.step_tokens);
  return out;
}

}  // namespace tandem::serve
