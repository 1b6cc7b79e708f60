// What a run reports, as a reader of its files needs it: summary.json's keys, the columns of
// requests.csv and steps.csv, the detail levels of trace.json, and the stdout summary table.
// These are a contract (README.md, "Outputs"): add to them, never rename.
#pragma once
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "sim/workload/config.h"
#include "sim/engine/metrics.h"

namespace tandem {

// requests.csv: one row per request. Times in seconds from the run's start, latencies in ms;
// a cell is empty where it does not apply (no first token, not finished). output_len is the
// tokens generated; output_tokens (real backends) the space-separated token ids.
inline constexpr const char* kRequestsCsvHeader =
    "id,arrival_s,first_token_s,finish_s,prompt_len,output_len,status,max_output,fail_reason,first_scheduled_s,"
    "ttft_ms,tpot_ms,e2e_ms,itl_max_ms,prefix_group,cached_tokens,output_tokens\n";
// With prefill/decode separation, four columns before output_tokens: when the transfer of the
// prompt's KV started and ended, and the bytes it moved (one file for the run, both instances).
inline constexpr const char* kRequestsCsvPdHeader =
    "id,arrival_s,first_token_s,finish_s,prompt_len,output_len,status,max_output,fail_reason,first_scheduled_s,"
    "ttft_ms,tpot_ms,e2e_ms,itl_max_ms,prefix_group,cached_tokens,transfer_start_s,transfer_end_s,transfer_ms,"
    "transfer_bytes,output_tokens\n";
// steps.csv: one row per step. KV counts in blocks after planning; the cost terms are the cost
// model's breakdown (on a real backend, the shadow model's); predicted_ms and pred_error
// (relative) compare a real backend's measured step with that model; host_ms is the loop's own
// time on a real step outside the executor (from before planning to its tokens reaching their
// requests; empty in simulated time and for steps run on a remote worker). A run of several
// instances adds kStepsCsvRoleColumn at the end: the role of the step's instance.
inline constexpr const char* kStepsCsvHeader =
    "step,instance,start_s,elapsed_ms,n_seqs,n_prefill,n_decode,n_tokens,kv_used_blocks,kv_reserved_blocks,kv_util,"
    "waiting,running,gemm_ms,attention_ms,overhead_ms,after_idle,n_samples,attn_pairs,context_tokens,comm_ms,"
    "predicted_ms,pred_error,host_ms\n";
inline constexpr const char* kStepsCsvRoleColumn = "role";

nlohmann::json summary_json(const Summary& s, const Workload& w);
void print_summary(std::ostream& os, const Summary& s);
// summary.json's `attainment` object and the stdout line for it (Attainment, sim/engine/metrics.h).
nlohmann::json attainment_json(const Attainment& a);
std::string attainment_text(const Attainment& a);

// summary.json's `layout` object, and the words for it (from the object, so that `tandem compare`
// says of a file what `tandem run` said of the run). A null or absent layout (a summary.json
// from before tandem recorded it) reads "layout unknown".
nlohmann::json layout_json(const RunLayout& l);
// "1 instance, 1 GPU"; "2 colocated replicas (data_parallel, TP 1 each), 2 GPUs";
// "1P1D (prefill TP 1 + decode TP 1, sim channel), 2 GPUs". CPU ranks where no GPU is held.
std::string layout_text(const nlohmann::json& layout);
// The same in a few words, for a table cell: "1 GPU", "dp2, 2 GPUs", "1P1D, 2 GPUs, TTFT@P".
std::string layout_brief(const nlohmann::json& layout);
// Which first token ttft_ms counts, in words (layout.first_token_from).
std::string first_token_text(const nlohmann::json& layout);

// How much of the run trace.json holds (`tandem run --trace`); each level holds the one
// before. None: no trace.json. Requests: the queue, batch and KV counters and each
// request's queued / prefill / decode spans. Steps: also one slice per step on its
// instance's track. Full: also each step slice's args (seqs, tokens, prefill_seqs).
enum class TraceDetail { None, Requests, Steps, Full };
TraceDetail parse_trace_detail(const std::string& s);  // throws InputError

}  // namespace tandem
