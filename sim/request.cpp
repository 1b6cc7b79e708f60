#include "sim/request.h"

namespace tandem {

std::string_view to_string(RequestStatus s) {
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

std::string_view to_string(FailReason r) {
  switch (r) {
    case FailReason::None: return "";
    case FailReason::EmptyPrompt: return "empty_prompt";
    case FailReason::EmptyOutput: return "empty_output";
    case FailReason::ExceedsMaxModelLen: return "exceeds_max_model_len";
    case FailReason::ExceedsKvCapacity: return "exceeds_kv_capacity";
    case FailReason::PromptOverBudget: return "prompt_over_token_budget";
    case FailReason::NoStateSlots: return "no_state_slots";
    case FailReason::BackendError: return "backend_error";
  }
  return "?";
}

}  // namespace tandem
