#include "policies/scheduler.h"

#include <algorithm>
#include <stdexcept>

namespace tandem {

std::string_view to_string(BatchingPolicy p) { return p == BatchingPolicy::Static ? "static" : "continuous"; }
std::string_view to_string(StepComposition c) {
  return c == StepComposition::PromptsOrDecodes ? "prompts_or_decodes" : "mixed";
}
std::string_view to_string(InstanceRole r) {
  return r == InstanceRole::Prefill ? "prefill" : r == InstanceRole::Decode ? "decode" : "colocated";
}

Scheduler::Scheduler(const SchedulerConfig& cfg, std::span<Request> requests, KvCache& kv)
    : cfg_(cfg), reqs_(requests), kv_(kv), cancel_pending_(requests.size(), 0) {
  if (cfg.enable_prefix_caching) prompt_hashes_.resize(requests.size());
  if (cfg.max_num_seqs < 1 || cfg.max_num_batched_tokens < 1 || cfg.max_num_partial_prefills < 1)
    throw std::invalid_argument(
        "Scheduler: max_num_seqs, max_num_batched_tokens and max_num_partial_prefills must be >= 1");
  if (cfg.step_composition == StepComposition::PromptsOrDecodes && cfg.enable_chunked_prefill)
    throw std::invalid_argument("Scheduler: step composition prompts_or_decodes needs chunked prefill off");
  running_.reserve(static_cast<size_t>(cfg.max_num_seqs));
  // With several prompts allowed part-way, each gets at most its share of the budget, so a
  // prompt behind a long one can start in the same step (vLLM's concurrent partial prefills).
  chunk_cap_ = std::max(1, cfg.max_num_batched_tokens / cfg.max_num_partial_prefills);
  partial_.reserve(static_cast<size_t>(std::min(cfg.max_num_seqs, 2 * cfg.max_num_partial_prefills)));
  plan_.seqs.reserve(static_cast<size_t>(cfg.max_num_seqs));
}

void Scheduler::requests_moved(std::span<Request> requests) {
  if (requests.size() < reqs_.size()) throw std::logic_error("Scheduler::requests_moved: the table shrank");
  reqs_ = requests;
  cancel_pending_.resize(requests.size(), 0);
  if (cfg_.enable_prefix_caching) prompt_hashes_.resize(requests.size());
}

FailReason Scheduler::arrival_failure(const Request& r) const {
  if (r.prompt_len < 1) return FailReason::EmptyPrompt;
  if (r.max_output < 1) return FailReason::EmptyOutput;
  if (int64_t{r.prompt_len} + r.max_output > cfg_.max_model_len) return FailReason::ExceedsMaxModelLen;
  if (!kv_.fits_at_all(reservation_tokens(r)))
    return cfg_.role == InstanceRole::Decode ? FailReason::ExceedsDecodeKvCapacity : FailReason::ExceedsKvCapacity;
  // The decode instance never computes a prompt: its budget does not bound one.
  if (cfg_.role != InstanceRole::Decode && !cfg_.enable_chunked_prefill && r.prompt_len > cfg_.max_num_batched_tokens)
    return FailReason::PromptOverBudget;
  if (!kv_.has_state_slots()) return FailReason::NoStateSlots;
  return FailReason::None;
}

bool Scheduler::add_request(ReqId id, Time now, std::vector<BlockHash> prompt_hashes) {
  // One compare per arrival: an open run that grew its table without telling (requests_moved).
  if (static_cast<size_t>(id) >= cancel_pending_.size())
    throw std::logic_error("Scheduler::add_request: a request id beyond the scheduler's table");
  Request& r = reqs_[static_cast<size_t>(id)];
  if (const FailReason why = arrival_failure(r); why != FailReason::None) {
    r.fail_reason = why;
    leave(r, RequestStatus::Failed, now);
    return false;
  }
  r.status = RequestStatus::Waiting;
  if (cfg_.enable_prefix_caching) prompt_hashes_[static_cast<size_t>(id)] = std::move(prompt_hashes);
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
    {
      const auto it = std::find(running_.begin(), running_.end(), id);
      // A request handed off or still receiving is the handoff's to cancel, not the scheduler's.
      if (it == running_.end()) throw std::logic_error("Scheduler::cancel: request is not in this instance's running set");
      kv_.release(id);
      running_.erase(it);
    }
      if (auto it = std::find(partial_.begin(), partial_.end(), id); it != partial_.end()) partial_.erase(it);
      // A static batch's member that has generated all it may, waiting for its batch, has
      // finished: the same status as when the cancel lands during a step (complete_step).
      leave(r, done_generating(r) ? RequestStatus::Finished : RequestStatus::Cancelled, now);
      return true;
    default: return false;  // not arrived yet (the engine's business) or already gone
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
  partial_after_step_ = 0;
  if (cfg_.step_composition == StepComposition::PromptsOrDecodes)
    schedule_prompts_or_decodes(now);
  else
    schedule_mixed(now);
  in_flight_ = !plan_.empty();
  return plan_;
}

// Static batching admits only into an empty engine; continuous at every step (may_admit). Either
// way the check is O(1) per candidate, and nothing is done when nobody waits or seats are full.
void Scheduler::schedule_mixed(Time now) {
  schedule_running();
  if (!partial_.empty()) schedule_partial_prefills();
  if (may_admit()) admit_waiting(now);
}

// As vLLM v0's _schedule_default: prompts are admitted first with the whole budget (the running
// requests still hold their seats); only a step that admitted none runs the decodes. Chunking
// is off (checked at construction), so no prompt is ever part-way.
void Scheduler::schedule_prompts_or_decodes(Time now) {
  if (may_admit()) admit_waiting(now);
  if (plan_.empty()) schedule_running();
}

void Scheduler::add_to_plan(ReqId id, const Request& r, int32_t n) {
  kv_.ensure_capacity(id, int64_t{r.num_computed} + n);
  // Only the step that reaches the end of the sequence samples: a prompt's last chunk, or a decode.
  const bool samples = r.num_computed + n == r.target_len();
  plan_.add({id, n, r.num_computed, samples, kv_.block_table(id)}, r.prompt_len);
  budget_left_ -= n;
}

// Decodes first: one token each, in admission order. A prompt part-way through its chunks
// waits for schedule_partial_prefills, so a long prompt never starves the decodes.
void Scheduler::schedule_running() {
  for (ReqId id : running_) {
    const Request& r = reqs_[static_cast<size_t>(id)];
    if (done_generating(r) || r.prefilling()) continue;  // static: waits for its batch; chunked: later
    const int32_t n = r.target_len() - r.num_computed;
    if (n > budget_left_) continue;
    add_to_plan(id, r, n);
  }
}

// Prompts already part-way continue with what the decodes left of the budget, oldest first.
void Scheduler::schedule_partial_prefills() {
  for (ReqId id : partial_) {
    const Request& r = reqs_[static_cast<size_t>(id)];
    const int32_t n = std::min({r.prompt_len - r.num_computed, budget_left_, chunk_cap_});
    if (n > 0) add_to_plan(id, r, n);
    if (r.num_computed + n < r.prompt_len) ++partial_after_step_;
  }
}

void Scheduler::admit_waiting(Time now) {
  while (static_cast<int32_t>(running_.size()) < cfg_.max_num_seqs && budget_left_ > 0) {
    const ReqId id = front_waiting();
    if (id < 0) return;
    Request& r = reqs_[static_cast<size_t>(id)];
    // FCFS: the head of the queue blocks the ones behind it (no overtaking). Without chunking a
    // prompt must fit the budget left whole; with it, the prompt is cut to the budget left (and
    // the per-prompt chunk cap), as long as fewer than max_num_partial_prefills prompts stay
    // part-way after this step.
    // Prefix hit first (a pure lookup): it shortens what the prompt still has to compute.
    const int32_t cached = lookup_prefix_hit(id, r);
    const int32_t rest = r.prompt_len - cached;
    int32_t n = rest;
    if (cfg_.enable_chunked_prefill) n = std::min({n, budget_left_, chunk_cap_});
    if (n < rest && (!cfg_.enable_chunked_prefill || partial_after_step_ >= cfg_.max_num_partial_prefills)) return;
    if (n > budget_left_) return;
    const int64_t lifetime = reservation_tokens(r);
    if (!kv_.can_admit(lifetime, hit_)) return;
    waiting_.pop_front();
    --num_waiting_;
    kv_.admit(id, lifetime, hit_);  // the whole life is reserved now; blocks are taken as chunks compute
    r.status = RequestStatus::Running;
    r.first_scheduled = now;
    r.num_computed = cached;
    r.num_cached_tokens = cached;
    running_.push_back(id);
    add_to_plan(id, r, n);
    if (n < rest) {
      partial_.push_back(id);
      ++partial_after_step_;
    }
  }
}

// Looks up id's cached prefix into hit_ and returns its length in tokens (0 with caching off).
// At most (prompt_len - 1) tokens: the last prompt token is always computed, because its
// logits give the first output token; a prompt cached whole recomputes its last block.
int32_t Scheduler::lookup_prefix_hit(ReqId id, const Request& r) {
  hit_.clear();
  if (!cfg_.enable_prefix_caching) return 0;
  const std::vector<BlockHash>& hashes = prompt_hashes_[static_cast<size_t>(id)];
  if (hashes.empty()) return 0;
  kv_.match_prefix(hashes, (r.prompt_len - 1) / kv_.block_size(), hit_);
  return static_cast<int32_t>(hit_.blocks.size()) * kv_.block_size();
}

void Scheduler::leave(Request& r, RequestStatus status, Time now) {
  if (!prompt_hashes_.empty()) std::vector<BlockHash>().swap(prompt_hashes_[static_cast<size_t>(r.id)]);
  r.status = status;
  r.finish = now;
}

std::span<const ReqId> Scheduler::complete_step(Time now) {
  if (!in_flight_) throw std::logic_error("Scheduler::complete_step: no step in flight");
  in_flight_ = false;
  left_this_step_.clear();
  prefilled_.clear();
  for (const ScheduledSeq& s : plan_.seqs) {
    Request& r = reqs_[static_cast<size_t>(s.id)];
    const bool was_prefilling = r.prefilling();
    r.num_computed += s.num_tokens;
    if (s.samples) ++r.generated;
    // Prompt blocks this step completed become hits for later requests (also for one whose
    // prompt is still part-way: it shares what is done). A cancelled request's full blocks hold
    // valid KV too, so they are published before it leaves below.
    if (was_prefilling && cfg_.enable_prefix_caching) {
      auto& hashes = prompt_hashes_[static_cast<size_t>(s.id)];
      if (!hashes.empty()) kv_.publish_full_blocks(s.id, r.num_computed, hashes);
      if (!r.prefilling()) std::vector<BlockHash>().swap(hashes);  // no later admission needs them
    }
  }
  // Who leaves: finished requests (continuous: at once; static: when the whole batch is done)
  // and requests cancelled while the step ran. Compaction keeps admission order.
  const bool batch_done =
      cfg_.policy == BatchingPolicy::Static && std::all_of(running_.begin(), running_.end(), [&](ReqId id) {
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
      left_this_step_.push_back(id);
    } else if (cfg_.role == InstanceRole::Prefill && !r.prefilling()) {
      prefilled_.push_back(id);  // its first token is out: handed off, blocks held (see prefilled())
    } else {
      running_[keep++] = id;
    }
  }
  running_.resize(keep);
  // A prompt leaves the part-way list when its last chunk is computed, or when it is cancelled.
  if (!partial_.empty())
    std::erase_if(partial_, [&](ReqId id) {
      const Request& r = reqs_[static_cast<size_t>(id)];
      return r.status != RequestStatus::Running || !r.prefilling();
    });
  return left_this_step_;
}

void Scheduler::accept(ReqId id) {
  const Request& r = reqs_[static_cast<size_t>(id)];
  kv_.admit(id, reservation_tokens(r));
  kv_.ensure_capacity(id, r.prompt_len);
  ++num_receiving_;
}

void Scheduler::received(ReqId id) {
  --num_receiving_;
  running_.push_back(id);
}

void Scheduler::drop_receiving(ReqId id) {
  --num_receiving_;
  kv_.release(id);
}

}  // namespace tandem
