#include "sim/engine.h"

#include <algorithm>
#include <chrono>
#include <fmt/format.h>
#include <stdexcept>


namespace tandem {

namespace {
SchedulerConfig scheduler_config(const Workload& w) {
  return {w.engine.policy,        w.engine.max_num_seqs,           w.engine.max_num_batched_tokens,
          w.model.max_model_len,  w.engine.enable_chunked_prefill, w.engine.max_num_partial_prefills,
          w.engine.enable_prefix_caching};
}
}  // namespace

Engine::Engine(const Workload& w, RequestSet requests, executor_i& executor, clock_i& clock)
    : w_(w),
      set_(std::move(requests)),
      exec_(executor),
      clock_(clock),
      kv_(w.engine.resolved_kv_blocks, w.engine.block_size, w.engine.state_slots, int32_t(set_.requests.size())),
      sched_(scheduler_config(w), set_.requests, kv_),
      prompt_(w.seed, w.model.vocab, set_),
      hash_root_(root_block_hash(w)) {
  if (!exec_.simulated()) outputs_.resize(set_.requests.size());
  if (w.engine.enable_prefix_caching) prompt_hashes_.resize(set_.requests.size());
}

void Engine::post_next_arrival() {
  // Arrivals are sorted: only the next one sits in the queue, which keeps the heap small.
  if (next_arrival_ < set_.requests.size()) {
    const Request& r = set_.requests[next_arrival_];
    events_.post(r.arrival, Arrival{r.id});
    ++next_arrival_;
  }
}

Summary Engine::run() {
  const auto wall_start = std::chrono::steady_clock::now();
  for (const Request& r : set_.requests)
    if (r.cancel_at != kNever) events_.post(r.cancel_at, Cancel{r.id});
  post_next_arrival();
  while (!events_.empty()) {
    TimedEvent e = events_.pop();
    clock_.advance_to(e.time);
    // A wall clock may already be past the event (the loop was busy running a step).
    now_ = std::max(e.time, clock_.now());
    std::visit([this](const auto& ev) { on(ev); }, e.event);
    // Take in everything that happens at this instant before planning the next step.
    if (events_.empty() || events_.top().time > now_) start_step_if_idle();
  }
  int64_t lost = 0;
  for (const Request& r : set_.requests) lost += r.alive();
  if (lost > 0 || sched_.in_flight())
    throw std::runtime_error(fmt::format("engine: {} request(s) neither finished, cancelled nor failed at the end of the run (lost event)", lost));
  // Leak check: with every request gone, no block may still be referenced and nothing reserved
  // (cached blocks stay, unreferenced, on the free list).
  if (kv_.used_blocks() != 0 || kv_.reserved_remaining() != 0)
    throw std::runtime_error(fmt::format("engine: KV leak at the end of the run: {} block(s) still referenced, {} reserved",
                                         kv_.used_blocks(), kv_.reserved_remaining()));
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  Summary s = metrics_.summarize(set_.requests, w_, exec_.name(), wall_s);
  s.sim_s = to_seconds(now_);
  s.prefix_evictions = kv_.evictions();
  return s;
}

void Engine::on(const Arrival& e) {
  post_next_arrival();
  Request& r = set_.requests[size_t(e.id)];
  if (!r.alive()) return;  // cancelled before it arrived
  std::span<const BlockHash> hashes;
  if (!prompt_hashes_.empty()) {
    hash_prompt_blocks(r, prompt_, w_.engine.block_size, hash_root_, prompt_hashes_[size_t(e.id)]);
    hashes = prompt_hashes_[size_t(e.id)];
  }
  if (!sched_.add_request(e.id, now_, hashes)) done(r);
}

void Engine::on(const Cancel& e) {
  Request& r = set_.requests[size_t(e.id)];
  if (r.status == RequestStatus::Pending) {  // cancelled before arrival: ends at its arrival
    r.status = RequestStatus::Cancelled;
    r.finish = r.arrival;
    done(r);
    return;
  }
  if (sched_.cancel(e.id, now_)) done(r);
}

void Engine::on(const TransferDone&) { throw std::logic_error("TransferDone: PD separation is not built yet"); }

void Engine::on(const StepDone&) {
  const StepPlan& plan = sched_.current_plan();
  size_t k = 0;
  for (const ScheduledSeq& s : plan.seqs) {
    if (!s.samples) continue;
    Request& r = set_.requests[size_t(s.id)];
    metrics_.on_token(r, now_);
    if (!outputs_.empty() && k < inflight_result_.sampled.size()) outputs_[size_t(s.id)].push_back(inflight_result_.sampled[k]);
    ++k;
  }
  for (run_observer_i* o : observers_) o->on_step(inflight_);
  for (ReqId id : sched_.complete_step(now_)) done(set_.requests[size_t(id)]);
  if (!prompt_hashes_.empty())
    for (const ScheduledSeq& s : plan.seqs)
      if (!set_.requests[size_t(s.id)].prefilling()) drop_prompt_hashes(s.id);
}

void Engine::drop_prompt_hashes(ReqId id) {
  if (!prompt_hashes_.empty() && !prompt_hashes_[size_t(id)].empty()) std::vector<BlockHash>().swap(prompt_hashes_[size_t(id)]);
}

void Engine::start_step_if_idle() {
  if (sched_.in_flight()) return;
  StepPlan& plan = sched_.schedule(now_);
  if (plan.empty()) return;
  if (exec_.needs_tokens()) attach_tokens(plan);
  plan.after_idle = steps_ == 0 || now_ - last_step_end_ >= kIdleGap;
  try {
    inflight_result_ = exec_.execute(plan);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("step {} at t={:.6f}s failed in the {} backend: {}", steps_, to_seconds(now_),
                                         exec_.name(), e.what()));
  }
  if (exec_.needs_tokens() && int32_t(inflight_result_.sampled.size()) != plan.num_samples)
    throw std::runtime_error(fmt::format("the {} backend returned {} tokens for {} sampling sequences", exec_.name(),
                                         inflight_result_.sampled.size(), plan.num_samples));
  // The clock must not pass its range (a wrap would give negative times and wrong metrics).
  if (inflight_result_.elapsed < 0 || inflight_result_.elapsed > kMaxTime - now_)
    throw std::runtime_error(fmt::format(
        "step {} at t={:.6f}s takes {:.6g} s and would end past the simulator's time range ({:.0g} s): the steps are too "
        "slow for this workload's {} requests ({})", steps_, to_seconds(now_), to_seconds(inflight_result_.elapsed),
        kMaxTimeSeconds, set_.requests.size(),
        !exec_.simulated() ? std::string("measured steps")
        : w_.hardware.fitted ? fmt::format("hardware '{}': a fitted profile", w_.hardware.name)
        : w_.hardware.profiled ? fmt::format("hardware '{}': a profiled profile", w_.hardware.name)
                             : fmt::format("hardware '{}': peak_tflops {:.6g}, mem_bandwidth_tbs {:.6g}, step_overhead_us "
                                           "{:.6g}; model '{}'", w_.hardware.name, w_.hardware.peak_flops / 1e12,
                                           w_.hardware.mem_bandwidth / 1e12, w_.hardware.step_overhead_s * 1e6,
                                           w_.model.name)));
  inflight_.index = steps_++;
  inflight_.start = now_;
  inflight_.elapsed = inflight_result_.elapsed;
  inflight_.plan = &plan;
  inflight_.cost = shadow_ ? shadow_->estimate(plan) : inflight_result_.cost;
  inflight_.kv_used = kv_.used_blocks();
  inflight_.kv_reserved = kv_.reserved_remaining();
  inflight_.kv_capacity = kv_.num_blocks();
  inflight_.waiting = sched_.num_waiting();
  inflight_.running = sched_.num_running();
  metrics_.on_step(now_, inflight_.elapsed, inflight_.kv_used, inflight_.kv_capacity, plan.num_decode_seqs,
                   plan.num_prefill_seqs);
  last_step_end_ = now_ + inflight_.elapsed;
  events_.post(last_step_end_, StepDone{0});
}

void Engine::attach_tokens(StepPlan& plan) {
  plan.tokens.clear();
  plan.tokens.reserve(size_t(plan.num_tokens));
  for (const ScheduledSeq& s : plan.seqs) {
    const Request& r = set_.requests[size_t(s.id)];
    const auto& out = outputs_[size_t(s.id)];
    const int32_t end = s.num_computed_before + s.num_tokens;
    const int32_t prompt_end = std::min(end, r.prompt_len);
    if (s.num_computed_before < prompt_end) {  // the prompt part, a run at a time
      const size_t at = plan.tokens.size();
      plan.tokens.resize(at + size_t(prompt_end - s.num_computed_before));
      prompt_.fill(r, s.num_computed_before, prompt_end - s.num_computed_before, plan.tokens.data() + at);
    }
    for (int32_t p = std::max(s.num_computed_before, r.prompt_len); p < end; ++p) plan.tokens.push_back(out[size_t(p - r.prompt_len)]);
  }
}

void Engine::done(const Request& r) {
  drop_prompt_hashes(r.id);
  for (run_observer_i* o : observers_) o->on_request_done(r);
}

}  // namespace tandem
