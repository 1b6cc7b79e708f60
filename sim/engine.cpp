#include "sim/engine.h"

#include <fmt/format.h>
#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "backend/cost_model.h"

namespace tandem {

Engine::Engine(const Workload& w, RequestSet requests, executor_i& executor, clock_i& clock)
    : w_(w),
      requests_(std::move(requests)),
      clock_(clock),
      prompt_tokens_(w.seed, w.model.vocab, requests_),
      hash_root_(root_block_hash(w)) {
  const KvCacheShape kv{w.engine.resolved_kv_blocks, w.engine.block_size, w.engine.state_slots};
  instances_.push_back(std::make_unique<Instance>(0, scheduler_config(w), kv, requests_.requests, executor));
  if (!executor.simulated()) outputs_.resize(requests_.requests.size());
}

void Engine::post_next_arrival() {
  // Arrivals are sorted: only the next one sits in the queue, which keeps the heap small.
  if (next_arrival_ < requests_.requests.size()) {
    const Request& r = requests_.requests[next_arrival_];
    events_.post(r.arrival, Arrival{r.id});
    ++next_arrival_;
  }
}

Summary Engine::run() {
  const auto wall_start = std::chrono::steady_clock::now();
  for (const Request& r : requests_.requests)
    if (r.cancel_at != kNever) events_.post(r.cancel_at, Cancel{r.id});
  post_next_arrival();
  for (;;) {
    take_in_inbox();
    if (events_.empty()) break;
    if (!clock_.wait_until(events_.top().time, inbox_)) continue;  // a post came first: take it in
    TimedEvent e = events_.pop();
    // A wall clock may already be past the event (the loop was busy running a step).
    now_ = std::max(e.time, clock_.now());
    std::visit([this](const auto& ev) { on(ev); }, e.event);
    // Take in everything that happens at this instant before planning the next steps.
    if (events_.empty() || events_.top().time > now_) start_idle_instances();
  }
  check_nothing_lost();
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  MetricsRecorder::RunEnd end{instances_[0]->executor.name(), wall_s, now_, 0};
  for (const auto& in : instances_) end.prefix_evictions += in->kv.evictions();
  return metrics_.summarize(requests_.requests, w_, end);
}

// Events posted by other threads happen when the loop takes them in.
void Engine::take_in_inbox() {
  if (inbox_.empty()) return;
  const Time at = std::max(now_, clock_.now());
  inbox_.drain([&](Event&& e) { events_.post(at, std::move(e)); });
}

void Engine::check_nothing_lost() const {
  int64_t lost = 0;
  for (const Request& r : requests_.requests) lost += r.alive();
  for (const auto& in : instances_)
    if (in->scheduler.in_flight()) ++lost;
  if (lost > 0)
    throw std::runtime_error(fmt::format(
        "engine: {} request(s) neither finished, cancelled nor failed at the end of the run (lost event)", lost));
  // Leak check: with every request gone, no block may still be referenced and nothing reserved
  // (cached blocks stay, unreferenced, on the free list).
  for (const auto& in : instances_)
    if (in->kv.used_blocks() != 0 || in->kv.reserved_remaining() != 0)
      throw std::runtime_error(
          fmt::format("engine: KV leak at the end of the run on instance {}: {} block(s) still "
                      "referenced, {} reserved",
                      in->id, in->kv.used_blocks(), in->kv.reserved_remaining()));
}

void Engine::on(const Arrival& e) {
  post_next_arrival();
  Request& r = requests_.requests[size_t(e.id)];
  if (!r.alive()) return;  // cancelled before it arrived
  Scheduler& sched = instances_[0]->scheduler;
  // Per-token work (hashing the prompt) only for a request that can be served at all.
  std::vector<BlockHash> hashes;
  if (w_.engine.enable_prefix_caching && sched.arrival_failure(r) == FailReason::None)
    hash_prompt_blocks(r, prompt_tokens_, w_.engine.block_size, hash_root_, hashes);
  if (!sched.add_request(e.id, now_, std::move(hashes))) on_request_left(r);
}

void Engine::on(const Cancel& e) {
  Request& r = requests_.requests[size_t(e.id)];
  if (r.status == RequestStatus::Pending) {  // cancelled before arrival: ends at its arrival
    r.status = RequestStatus::Cancelled;
    r.finish = r.arrival;
    on_request_left(r);
    return;
  }
  if (instances_[0]->scheduler.cancel(e.id, now_)) on_request_left(r);
}

void Engine::on(const StepDone& e) {
  Instance& in = *instances_.at(size_t(e.instance));
  const StepPlan& plan = in.scheduler.current_plan();
  size_t k = 0;
  for (const ScheduledSeq& s : plan.seqs) {
    if (!s.samples) continue;
    Request& r = requests_.requests[size_t(s.id)];
    metrics_.on_token(r, now_);
    if (!outputs_.empty() && k < in.inflight_result.sampled.size())
      outputs_[size_t(s.id)].push_back(in.inflight_result.sampled[k]);
    ++k;
  }
  for (run_observer_i* o : observers_) o->on_step(in.inflight);
  for (ReqId id : in.scheduler.complete_step(now_)) on_request_left(requests_.requests[size_t(id)]);
}

void Engine::start_idle_instances() {
  for (const auto& in : instances_)
    if (!in->scheduler.in_flight()) start_step(*in);
}

// Plan, execute, check, record, and post the step's end.
void Engine::start_step(Instance& in) {
  StepPlan& plan = in.scheduler.schedule(now_);
  if (plan.empty()) return;
  if (in.executor.needs_tokens()) attach_tokens(plan);
  plan.after_idle = in.num_steps == 0 || now_ - in.last_step_end >= kIdleGap;
  try {
    in.inflight_result = in.executor.execute(plan);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("step {} at t={:.6f}s failed in the {} backend: {}", num_steps_,
                                         to_seconds(now_), in.executor.name(), e.what()));
  }
  check_step_result(in, plan);
  record_step(in, plan);
  events_.post(in.last_step_end, StepDone{in.id});
}

void Engine::check_step_result(const Instance& in, const StepPlan& plan) const {
  const StepResult& res = in.inflight_result;
  if (in.executor.needs_tokens() && int32_t(res.sampled.size()) != plan.num_samples)
    throw std::runtime_error(fmt::format("the {} backend returned {} tokens for {} sampling sequences",
                                         in.executor.name(), res.sampled.size(), plan.num_samples));
  // The clock must not pass its range (a wrap would give negative times and wrong metrics).
  if (res.elapsed < 0 || res.elapsed > kMaxTime - now_)
    throw std::runtime_error(fmt::format(
        "step {} at t={:.6f}s takes {:.6g} s and would end past the simulator's time range ({:.0g} s): the steps are "
        "too "
        "slow for this workload's {} requests ({})",
        num_steps_, to_seconds(now_), to_seconds(res.elapsed), kMaxTimeSeconds, requests_.requests.size(),
        in.executor.simulated() ? make_cost_model(w_.model, w_.hardware, w_.engine.tp)->inputs() : "measured steps"));
}

void Engine::record_step(Instance& in, const StepPlan& plan) {
  StepRecord& rec = in.inflight;
  rec.index = num_steps_++;
  ++in.num_steps;
  rec.start = now_;
  rec.elapsed = in.inflight_result.elapsed;
  rec.plan = &plan;
  rec.cost = in.shadow_cost_model ? in.shadow_cost_model->estimate(plan) : in.inflight_result.cost;
  rec.kv_used = in.kv.used_blocks();
  rec.kv_reserved = in.kv.reserved_remaining();
  rec.kv_capacity = in.kv.num_blocks();
  rec.waiting = in.scheduler.num_waiting();
  rec.running = in.scheduler.num_running();
  metrics_.on_step(rec.elapsed, rec.kv_used, rec.kv_capacity, plan.num_decode_seqs, plan.num_prefill_seqs);
  in.last_step_end = now_ + rec.elapsed;
}

void Engine::attach_tokens(StepPlan& plan) {
  plan.tokens.clear();
  plan.tokens.reserve(size_t(plan.num_tokens));
  for (const ScheduledSeq& s : plan.seqs) {
    const Request& r = requests_.requests[size_t(s.id)];
    const auto& out = outputs_[size_t(s.id)];
    const int32_t end = s.num_computed_before + s.num_tokens;
    const int32_t prompt_end = std::min(end, r.prompt_len);
    if (s.num_computed_before < prompt_end) {  // the prompt part, a run at a time
      const size_t at = plan.tokens.size();
      plan.tokens.resize(at + size_t(prompt_end - s.num_computed_before));
      prompt_tokens_.fill(r, s.num_computed_before, prompt_end - s.num_computed_before, plan.tokens.data() + at);
    }
    for (int32_t p = std::max(s.num_computed_before, r.prompt_len); p < end; ++p)
      plan.tokens.push_back(out[size_t(p - r.prompt_len)]);
  }
}

void Engine::on_request_left(const Request& r) {
  for (run_observer_i* o : observers_) o->on_request_done(r);
}

}  // namespace tandem
