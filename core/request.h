// One request's description (from the workload) and its life in a run.
// Kept compact and flat: a million of these must fit in well under a gigabyte.
// A leaf header (header-only): policies/ and backend/ include it.
#pragma once
#include <cstdint>
#include <string_view>

#include "core/time.h"

namespace tandem {

using ReqId = int32_t;  // dense: index into the run's request table
using Token = int32_t;

enum class RequestStatus : uint8_t { Pending, Waiting, Running, Finished, Cancelled, Failed };

// Why a request failed. Every request ends finished, cancelled or failed with one of these.
enum class FailReason : uint8_t {
  None,
  EmptyPrompt,         // prompt_len < 1
  EmptyOutput,         // max_output < 1
  ExceedsMaxModelLen,  // prompt + max_output > model.max_model_len
  ExceedsKvCapacity,   // its whole-life reservation is larger than the entire KV cache
  PromptOverBudget,    // prompt > max_num_batched_tokens and prompts are not chunked
  NoStateSlots,        // hybrid model with zero state slots
  BackendError,        // the executor failed a step this request was in
  ExceedsDecodeKvCapacity,  // 1P1D: its whole-life reservation is larger than the decode instance's cache
  TransferFailed,           // 1P1D: the KV channel failed or timed out moving its prompt's KV
  PeerLost,                 // 1P1D over tcp: the decode worker went away while the request was alive
};

inline std::string_view to_string(RequestStatus s) {
  switch (s) {
    case RequestStatus::Pending: return "pending";
    case RequestStatus::Waiting: return "waiting";
    case RequestStatus::Running: return "running";
    case RequestStatus::Finished: return "finished";
    case RequestStatus::Cancelled: return "cancelled";
    case RequestStatus::Failed: return "failed";
  }
  return "?";
}

inline std::string_view to_string(FailReason r) {
  switch (r) {
    case FailReason::None: return "";
    case FailReason::EmptyPrompt: return "empty_prompt";
    case FailReason::EmptyOutput: return "empty_output";
    case FailReason::ExceedsMaxModelLen: return "exceeds_max_model_len";
    case FailReason::ExceedsKvCapacity: return "exceeds_kv_capacity";
    case FailReason::PromptOverBudget: return "prompt_over_token_budget";
    case FailReason::NoStateSlots: return "no_state_slots";
    case FailReason::BackendError: return "backend_error";
    case FailReason::ExceedsDecodeKvCapacity: return "exceeds_decode_kv_capacity";
    case FailReason::TransferFailed: return "kv_transfer_failed";
    case FailReason::PeerLost: return "decode_worker_lost";
  }
  return "?";
}

struct Request {
  // --- description (workload) ---
  ReqId id = 0;
  Time arrival = 0;
  Time cancel_at = kNever;  // a Cancel event fires then, if the request is still alive
  int32_t prompt_len = 0;
  int32_t max_output = 0;       // tokens to generate (EOS ignored, as in serving benchmarks)
  int32_t prefix_group = -1;    // shared-prefix group, -1 if none
  int32_t prefix_len = 0;       // leading tokens shared with the group
  uint32_t hash_ids_begin = 0;  // Mooncake prefix-block hashes: [begin, begin + count) in the pool
  uint32_t hash_ids_count = 0;

  // --- progress (scheduler) ---
  int32_t num_computed = 0;       // tokens whose KV is in the cache
  int32_t generated = 0;          // output tokens sampled so far
  int32_t num_cached_tokens = 0;  // prompt tokens served from the prefix cache at admission
  RequestStatus status = RequestStatus::Pending;
  FailReason fail_reason = FailReason::None;

  // --- timestamps and per-request latency statistics (engine) ---
  Time first_scheduled = kNever;
  Time first_token = kNever;
  Time last_token = kNever;
  Time finish = kNever;
  // Inter-token latency, summarised online (Welford) so no per-token storage is needed.
  double itl_mean_ns = 0.0;
  double itl_m2 = 0.0;
  Duration itl_max = 0;

  int32_t target_len() const { return prompt_len + generated; }
  bool prefilling() const { return num_computed < prompt_len; }
  bool alive() const {
    return status == RequestStatus::Pending || status == RequestStatus::Waiting || status == RequestStatus::Running;
  }
};

}  // namespace tandem
