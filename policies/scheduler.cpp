#include "policies/scheduler.h"

#include <algorithm>
#include <stdexcept>

namespace tandem {

std::string_view to_string(BatchingPolicy p) {
  return p == BatchingPolicy::Static ? "static" : "continuous";
}

Scheduler::Scheduler(const SchedulerConfig& cfg, std::span<Request> requests, KvCache& kv)
    : cfg_(cfg), reqs_(requests), kv_(kv), cancel_pending_(requests.size(), 0) {
  if (cfg.max_num_seqs < 1 || cfg.max_num_batched_tokens < 1)
    throw std::invalid_argument("Scheduler: max_num_seqs and max_num_batched_tokens must be >= 1");
  running_.reserve(static_cast<size_t>(cfg.max_num_seqs));
  plan_.seqs.reserve(static_cast<size_t>(cfg.max_num_seqs));
}

bool Scheduler::add_request(ReqId id, Time now) {
  Request& r = reqs_[static_cast<size_t>(id)];
  const int64_t lifetime = int64_t{r.prompt_len} + r.max_output;
  FailReason why = FailReason::None;
  if (r.prompt_len < 1) why = FailReason::EmptyPrompt;
  else if (r.max_output < 1) why = FailReason::EmptyOutput;
  else if (lifetime > cfg_.max_model_len) why = FailReason::ExceedsMaxModelLen;
  else if (!kv_.fits_at_all(lifetime)) why = FailReason::ExceedsKvCapacity;
  else if (r.prompt_len > cfg_.max_num_batched_tokens) why = FailReason::PromptOverBudget;
  else if (!kv_.has_state_slots()) why = FailReason::NoStateSlots;
  if (why != FailReason::None) {
    r.fail_reason = why;
    leave(r, RequestStatus::Failed, now);
    return false;
  }
  r.status = RequestStatus::Waiting;
  waiting_.push_back(id);
  ++num_waiting_;
  return true;
}

bool Scheduler::cancel(ReqId id, Time now) {
  Request& r = reqs_[static_cast<size_t>(id)];
  switch (r.status) {
    case RequestStatus::Waiting:
      --num_waiting_;  // its queue entry is skipped lazily
      leave(r, RequestStatus::Cancelled, now);
      return true;
    case RequestStatus::Running:
      if (in_flight_) {
        cancel_pending_[static_cast<size_t>(id)] = 1;
        return false;
      }
      kv_.release(id);
      running_.erase(std::find(running_.begin(), running_.end(), id));
      leave(r, RequestStatus::Cancelled, now);
      return true;
    default:
      return false;  // not arrived yet (the engine's business) or already gone
  }
}

ReqId Scheduler::front_waiting() {
  while (!waiting_.empty() && reqs_[static_cast<size_t>(waiting_.front())].status != RequestStatus::Waiting)
    waiting_.pop_front();
  return waiting_.empty() ? -1 : waiting_.front();
}

StepPlan& Scheduler::schedule(Time now) {
  if (in_flight_) throw std::logic_error("Scheduler::schedule: a step is already in flight");
  plan_.clear();
  budget_left_ = cfg_.max_num_batched_tokens;
  schedule_running();
  // Static batching admits only into an empty engine; continuous at every step. Either way
  // the check is O(1) per candidate, and nothing is done when nobody waits or seats are full.
  if (num_waiting_ > 0 && (cfg_.policy == BatchingPolicy::Continuous || running_.empty())) admit_waiting(now);
  in_flight_ = !plan_.empty();
  return plan_;
}

void Scheduler::schedule_running() {
  for (ReqId id : running_) {
    const Request& r = reqs_[static_cast<size_t>(id)];
    if (done_generating(r)) continue;  // static batching: waits for its batch to leave
    const int32_t n = r.target_len() - r.num_computed;
    if (n > budget_left_) continue;
    kv_.ensure_capacity(id, int64_t{r.num_computed} + n);
    plan_.seqs.push_back({id, n, r.num_computed, true, kv_.block_table(id)});
    plan_.num_tokens += n;
    ++plan_.num_samples;
    ++(r.prefilling() ? plan_.num_prefill_seqs : plan_.num_decode_seqs);
    budget_left_ -= n;
  }
}

void Scheduler::admit_waiting(Time now) {
  while (static_cast<int32_t>(running_.size()) < cfg_.max_num_seqs) {
    const ReqId id = front_waiting();
    if (id < 0) return;
    Request& r = reqs_[static_cast<size_t>(id)];
    // FCFS: the head of the queue blocks the ones behind it (no overtaking).
    if (r.prompt_len > budget_left_) return;
    const int64_t lifetime = int64_t{r.prompt_len} + r.max_output;
    if (!kv_.can_admit(lifetime)) return;
    waiting_.pop_front();
    --num_waiting_;
    kv_.admit(id, lifetime);
    kv_.ensure_capacity(id, r.prompt_len);
    r.status = RequestStatus::Running;
    r.first_scheduled = now;
    running_.push_back(id);
    plan_.seqs.push_back({id, r.prompt_len, 0, true, kv_.block_table(id)});
    plan_.num_tokens += r.prompt_len;
    ++plan_.num_samples;
    ++plan_.num_prefill_seqs;
    budget_left_ -= r.prompt_len;
  }
}

void Scheduler::leave(Request& r, RequestStatus status, Time now) {
  r.status = status;
  r.finish = now;
}

std::span<const ReqId> Scheduler::complete_step(Time now) {
  if (!in_flight_) throw std::logic_error("Scheduler::complete_step: no step in flight");
  in_flight_ = false;
  left_.clear();
  for (const ScheduledSeq& s : plan_.seqs) {
    Request& r = reqs_[static_cast<size_t>(s.id)];
    r.num_computed += s.num_tokens;
    if (s.samples) ++r.generated;
  }
  // Who leaves: finished requests (continuous: at once; static: when the whole batch is done)
  // and requests cancelled while the step ran. Compaction keeps admission order.
  const bool batch_done = cfg_.policy == BatchingPolicy::Static &&
      std::all_of(running_.begin(), running_.end(), [&](ReqId id) {
        return done_generating(reqs_[static_cast<size_t>(id)]) || cancel_pending_[static_cast<size_t>(id)];
      });
  size_t keep = 0;
  for (ReqId id : running_) {
    Request& r = reqs_[static_cast<size_t>(id)];
    const bool cancelled = cancel_pending_[static_cast<size_t>(id)] != 0;
    const bool finished = done_generating(r) && (cfg_.policy == BatchingPolicy::Continuous || batch_done);
    if (cancelled || finished) {
      cancel_pending_[static_cast<size_t>(id)] = 0;
      kv_.release(id);
      leave(r, cancelled && !done_generating(r) ? RequestStatus::Cancelled : RequestStatus::Finished, now);
      left_.push_back(id);
    } else {
      running_[keep++] = id;
    }
  }
  running_.resize(keep);
  return left_;
}

}  // namespace tandem
