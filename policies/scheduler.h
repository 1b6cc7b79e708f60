// The scheduler: one loop, knobs per stage. Each step it decides how many tokens every
// request advances, within the token budget, max_num_seqs and the KV cache, and returns
// that plan. It never knows which executor runs the plan.
//
//   static      admit a batch only when nothing runs; the batch leaves together
//   continuous  requests join and leave at every step; a finished request frees its
//               blocks at once
//   chunked prefill (either policy)  there is no prefill phase and no decode phase: every
//               running request has num_computed and a target (prompt + generated), and the
//               step's token budget is handed out so that requests catch up: decodes first,
//               then prompts already part-way, then new admissions in FCFS order. A prompt
//               that does not fit the budget left is cut; only the chunk that reaches the
//               end of the prompt samples. Without chunking a prompt is computed whole in
//               its admission step (stage 1).
//   prefix caching (any of the above)  at admission the prompt's leading full blocks that are
//               already in the KV pool (matched by chained block hash) are taken instead of
//               computed: the request starts with num_computed = the hit length, and only the
//               rest is scheduled (chunked as above). The last prompt token is always computed,
//               since it samples the first output token. Blocks become hits for others once a
//               step has computed them whole, so a prompt part-way through its chunks already
//               shares its finished blocks.
//   step composition (stage 1, unchunked)  `mixed` (the default, Orca-style): every step takes
//               the running decodes first, then admits waiting prompts into what is left.
//               `prompts_or_decodes` (vLLM v0's default scheduler, the baseline most PD and
//               chunking papers compare against): a step that can admit a waiting prompt runs
//               prompts only, with the whole budget, and every running decode stalls for it;
//               a step that admits none runs the decodes. A baseline for comparisons, not a new
//               feature: no priorities, no preemption.
//
// Plan, then apply: schedule() chooses and allocates the KV the step needs; complete_step()
// applies the step's outcome (tokens computed, tokens sampled, requests that leave).
#pragma once
#include <cstdint>
#include <deque>
#include <span>
#include <string_view>
#include <vector>

#include "core/request.h"
#include "policies/kv_cache.h"
#include "policies/plan.h"

namespace tandem {

enum class BatchingPolicy : uint8_t { Static, Continuous };
std::string_view to_string(BatchingPolicy p);

// What one step may carry (see the header comment). PromptsOrDecodes needs chunking off: vLLM
// v0 with chunked prefill mixed decodes and chunks, which is what Mixed with chunking does.
enum class StepComposition : uint8_t { Mixed, PromptsOrDecodes };
std::string_view to_string(StepComposition c);

// What an instance serves (stage 4). Colocated: prompt and decode. Prefill: the prompt and the
// first token; then the request is handed off with its blocks held (prefilled()). Decode: takes
// requests handed over with their KV (accept/received) and decodes them; nothing arrives here.
enum class InstanceRole : uint8_t { Colocated, Prefill, Decode };
std::string_view to_string(InstanceRole r);

struct SchedulerConfig {
  BatchingPolicy policy = BatchingPolicy::Continuous;
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 8192;  // per-step token budget
  int32_t max_model_len = 8192;
  bool enable_chunked_prefill = true;  // false: stage 1 (a prompt runs whole, or fails at arrival)
  // Prompts that may be part-way at once (chunking only). Above 1, every prompt chunk is capped
  // at max_num_batched_tokens / max_num_partial_prefills, so that several prompts progress at once.
  int32_t max_num_partial_prefills = 1;
  StepComposition step_composition = StepComposition::Mixed;
  // Stage 3: admission takes a prompt's cached leading blocks. Needs the prompt's block hashes
  // (add_request); false, or no hashes, is stage 2 exactly.
  bool enable_prefix_caching = true;
  InstanceRole role = InstanceRole::Colocated;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& cfg, std::span<Request> requests, KvCache& kv);

  // Why a request arriving now could never be served (FailReason::None: it can wait). A pure
  // query: the engine asks it before doing any per-token work for the request (hashing).
  FailReason arrival_failure(const Request& r) const;
  // A request arrives. Returns false if it failed at once (arrival_failure; reason set on the
  // request): a request that can never be served must not wait forever. `prompt_hashes`: the
  // chained hashes of the prompt's full blocks (prefix caching). The scheduler owns them from
  // here, and frees them when the prompt is computed or the request leaves.
  bool add_request(ReqId id, Time now, std::vector<BlockHash> prompt_hashes = {});
  // Cancel a live request. A request inside the in-flight step leaves when the step ends.
  // Returns true if it left now.
  bool cancel(ReqId id, Time now);

  // Plan the next step. Empty plan: nothing to run. Mutable only so that the engine can
  // attach the input token ids before handing it to a real backend.
  StepPlan& schedule(Time now);
  // Apply the in-flight step's outcome at time `now`. Returns the requests that left
  // (finished or cancelled), valid until the next call.
  std::span<const ReqId> complete_step(Time now);

  bool in_flight() const { return in_flight_; }
  const StepPlan& current_plan() const { return plan_; }
  int32_t num_waiting() const { return num_waiting_; }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  // Running requests whose prompt is part-way computed (chunked prefill), admission order.
  std::span<const ReqId> partial_prefills() const { return partial_; }
  // KV tokens a request reserves at admission, for its whole life here (no preemption): the
  // prompt and every token it may generate; on a prefill instance the prompt alone (the first
  // token's KV is computed on the decode instance).
  int64_t reservation_tokens(const Request& r) const {
    return cfg_.role == InstanceRole::Prefill ? int64_t{r.prompt_len} : int64_t{r.prompt_len} + r.max_output;
  }

  // ---- prefill/decode separation (stage 4) ----
  // Prefill role: the requests whose prompt the last step finished and that still have tokens
  // to generate. They left the running set (their seat is free) but keep their blocks until
  // release_handed_off(): the channel reads them. Valid until the next complete_step().
  std::span<const ReqId> prefilled() const { return prefilled_; }
  // Prefill role: a handed-off request's transfer ended (done or aborted): its blocks go.
  void release_handed_off(ReqId id) { kv_.release(id); }
  // Decode role: could a request handed over now get a seat and its whole-life reservation?
  // A pure query (look before you commit).
  bool can_accept(const Request& r) const {
    return num_running() + num_receiving_ < cfg_.max_num_seqs && kv_.can_admit(reservation_tokens(r));
  }
  // Decode role: reserve the whole life and take the prompt's blocks, which the channel will
  // write (block_table(id)). The request holds a seat while it receives.
  void accept(ReqId id);
  // Decode role: the prompt's KV has arrived; the request decodes from the next step.
  void received(ReqId id);
  // Decode role: the transfer into id's blocks ended without delivering (cancelled, failed):
  // the blocks and the reservation go. Only once the channel can no longer write into them.
  void drop_receiving(ReqId id);
  int32_t num_receiving() const { return num_receiving_; }
  // An open run's request table grew (tandem serve): it moved to `requests`, which keeps every
  // request the old one held, in place, and has room for more ids. Its per-request tables grow
  // with it. Only between events (no reference into the old table is held then).
  void requests_moved(std::span<Request> requests);
  const KvCache& kv() const { return kv_; }
  const SchedulerConfig& config() const { return cfg_; }

 private:
  void schedule_mixed(Time now);
  void schedule_prompts_or_decodes(Time now);
  bool may_admit() const {
    return num_waiting_ > 0 && (cfg_.policy == BatchingPolicy::Continuous || running_.empty());
  }
  void schedule_running();
  void schedule_partial_prefills();
  void admit_waiting(Time now);
  int32_t lookup_prefix_hit(ReqId id, const Request& r);
  void add_to_plan(ReqId id, const Request& r, int32_t n);
  void leave(Request& r, RequestStatus status, Time now);
  ReqId front_waiting();
  bool done_generating(const Request& r) const { return r.generated >= r.max_output; }

  SchedulerConfig cfg_;
  std::span<Request> reqs_;
  KvCache& kv_;
  std::deque<ReqId> waiting_;   // FCFS; may hold cancelled ids, skipped lazily
  int32_t num_waiting_ = 0;     // live entries of waiting_
  std::vector<ReqId> running_;  // admission order
  // Running and still in the prompt after a chunk. At most max_num_partial_prefills stay
  // part-way after a step; while a step is planned, the ones it finishes are still listed next
  // to that step's new admissions, so the list may briefly hold up to twice that.
  std::vector<ReqId> partial_;
  int32_t partial_after_step_ = 0;  // of partial_ and this step's admissions: still part-way after this step
  int32_t chunk_cap_ = 0;           // most tokens one prompt chunk may take (budget / max partials)
  std::vector<std::vector<BlockHash>> prompt_hashes_;  // by ReqId, owned while the prompt is computed (caching on)
  PrefixHit hit_;                                      // scratch for match_prefix, reused
  std::vector<uint8_t> cancel_pending_;                // by ReqId: cancel arrived while the step was in flight
  StepPlan plan_;
  int32_t budget_left_ = 0;
  bool in_flight_ = false;
  std::vector<ReqId> left_this_step_;  // complete_step's answer
  std::vector<ReqId> prefilled_;       // prefill role: handed off by the last step
  int32_t num_receiving_ = 0;          // decode role: accepted, KV still on its way
};

}  // namespace tandem
