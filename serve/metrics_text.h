// GET /metrics: the Prometheus text format, with vLLM's metric names where one exists (so that
// dashboards made for vLLM read tandem serve), each labelled model_name as vLLM does:
//   vllm:num_requests_running, vllm:num_requests_waiting      gauges, from the last steps
//   vllm:kv_cache_usage_perc (and the older vllm:gpu_cache_usage_perc)  0..1, the fullest instance
//   vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total       prompt tokens
//   vllm:prompt_tokens_total, vllm:generation_tokens_total
//   vllm:request_success_total{finished_reason="length"|"abort"}, vllm:num_preemptions_total (0)
//   vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds,
//   vllm:e2e_request_latency_seconds, vllm:request_{queue,prefill,decode,inference}_time_seconds,
//   vllm:request_time_per_output_token_seconds                         histograms, vLLM's buckets
//   vllm:request_prompt_tokens, vllm:request_generation_tokens, vllm:request_params_max_tokens,
//   vllm:iteration_tokens_total                                         histograms of token counts
// and tandem's own where vLLM has none: tandem:requests_cancelled_total, tandem:requests_failed_total,
// tandem:kv_transfers_total, tandem:kv_transfer_bytes_total (prefill -> decode, under PD).
#pragma once
#include <string>

#include "serve/served_run.h"

namespace tandem::serve {

std::string metrics_text(LiveStats& s, const std::string& model);

}  // namespace tandem::serve
