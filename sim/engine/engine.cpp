#include "sim/engine/engine.h"

#include <fmt/format.h>
#include <algorithm>
#include <chrono>
#include <limits>
#include <stdexcept>

#include "backend/cost_model.h"
#include "sim/engine/topology_factory.h"

namespace tandem {

Engine::Engine(const Workload& w, RequestSet requests, executor_i& executor, clock_i& clock)
    : Engine(w, instance_specs(w), std::move(requests), executor, clock) {}

Engine::Engine(const Workload& w, const std::vector<InstanceSpec>& specs, RequestSet requests, executor_i& executor,
               clock_i& clock)
    : Engine(w, specs, std::move(requests), std::vector<executor_i*>(specs.size(), &executor), clock) {}

Engine::Engine(const Workload& w, std::vector<InstanceSpec> specs, RequestSet requests,
               std::span<executor_i* const> executors, clock_i& clock, kv_channel_i* channel)
    : w_(w),
      specs_(std::move(specs)),
      requests_(std::move(requests)),
      clock_(clock),
      prompt_tokens_(w.seed, w.model.vocab, requests_),
      hash_root_(root_block_hash(w)) {
  if (executors.size() != specs_.size())
    throw std::logic_error(fmt::format("Engine: {} executors for {} instances", executors.size(), specs_.size()));
  for (const InstanceSpec& s : specs_) {
    const KvCacheShape kv{s.engine.resolved_kv_blocks, s.engine.block_size, s.engine.state_slots};
    instances_.push_back(
        std::make_unique<Instance>(s.id, s.scheduler, kv, requests_.requests, *executors[size_t(s.id)]));
  }
  topology_ = make_topology(w, instances_, requests_.requests, channel, *this);
  if (requests_.has_given_prompts()) client_prompts_ = &given_prompts_;
  records_outputs_ = !executors[0]->simulated();
  if (records_outputs_) outputs_.resize(requests_.requests.size());
}

void Engine::post_next_arrival() {
  if (open_) return;  // an open run's arrivals come through the inbox
  // Arrivals are sorted: only the next one sits in the queue, which keeps the heap small.
  if (next_arrival_ < requests_.requests.size()) {
    const Request& r = requests_.requests[next_arrival_];
    events_.post(r.arrival, Arrival{r.id});
    ++next_arrival_;
  }
}

Summary Engine::run() {
  const auto wall_start = std::chrono::steady_clock::now();
  if (!open_)
    for (const Request& r : requests_.requests)
      if (r.cancel_at != kNever) events_.post(r.cancel_at, Cancel{r.id});
  post_next_arrival();
  for (;;) {
    take_in_inbox();
    if (awaiting_async()) check_deadlines();
    if (!run_error_.empty()) break;
    if (events_.empty() && !awaiting_async() && (!open_ || closed_)) break;
    // Wait for the next event, or for a completion from another thread or process (the inbox),
    // or, while one is awaited, until its deadline.
    Time next = events_.empty() ? kMaxTime : events_.top().time;
    for (const AsyncOp& op : async_ops_) next = std::min(next, op.deadline);
    if (!clock_.wait_until(next, inbox_)) continue;              // a post came first: take it in
    if (events_.empty() || events_.top().time > next) continue;  // a deadline, not an event
    TimedEvent e = events_.pop();
    // A wall clock may already be past the event (the loop was busy running a step).
    now_ = std::max(e.time, clock_.now());
    std::visit([this](const auto& ev) { on(ev); }, e.event);
    for (run_observer_i* o : observers_) o->on_event_done();
    // Take in everything that happens at this instant before planning the next steps.
    if (events_.empty() || events_.top().time > now_) start_idle_instances();
  }
  if (open_) {  // the slots no client took were never part of the run
    requests_.requests.resize(num_opened_);
    if (records_outputs_) outputs_.resize(num_opened_);
  }
  if (run_error_.empty()) check_nothing_lost();
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  MetricsRecorder::RunEnd end{instances_[0]->executor.name(), wall_s, now_, 0};
  for (const auto& in : instances_) end.prefix_evictions += in->kv.evictions();
  Summary s = metrics_.summarize(requests_.requests, w_, end);
  add_instance_figures(s);
  s.run_error = run_error_;
  return s;
}

RunLayout Engine::layout() const {
  RunLayout l;
  for (const auto& in : instances_) {
    const EngineSpec& e = specs_[size_t(in->id)].engine;
    const std::string backend = in->executor.name();
    const size_t at = backend.find('@');  // a decode worker: BACKEND@HOST:PORT, its devices its own
    const std::string kind = backend.substr(0, at);
    InstanceLayout il;
    il.id = in->id;
    il.role = std::string(to_string(in->role));
    il.backend = backend;
    il.tp = e.tp;
    il.gpus = kind == "cpu" ? 0 : e.tp;
    il.first_gpu = kind == "cuda" && at == std::string::npos ? e.device : -1;
    il.kv_blocks = in->kv.num_blocks();
    l.instances.push_back(il);
  }
  l.data_parallel = w_.engine.data_parallel;
  topology_->add_layout(l);
  return l;
}

void Engine::add_instance_figures(Summary& s) const {
  s.layout = layout();
  int64_t blocks = 0;
  Utilisation& u = s.utilisation;
  double gpus = 0, peak_x_gpus = 0;  // over the instances: their GPUs, and those GPUs' peaks summed
  bool peaks_known = true;
  for (size_t i = 0; i < instances_.size(); ++i) {
    const Instance& in = *instances_[i];
    const double busy_s = in.busy_time * 1e-9;
    // MFU: its model FLOPs over what its own GPUs (its hardware's peak) could do in the makespan.
    const int32_t in_gpus = s.layout.instances[i].gpus;
    const std::optional<double> peak = mfu_peak_flops(specs_[size_t(in.id)].hardware);
    s.instances.push_back({in.id, std::string(to_string(in.role)), in.kv.num_blocks(), in.num_steps,
                           in.busy_time > 0 ? in.kv_used_time / in.busy_time : 0.0, in.kv_peak, busy_s,
                           s.makespan_s > 0 ? busy_s / s.makespan_s : 0.0, in.model_flops,
                           model_flops_utilisation(in.model_flops, s.makespan_s, in_gpus, peak)});
    blocks += in.kv.num_blocks();
    u.model_flops += in.model_flops;
    gpus += in_gpus;
    peak_x_gpus += peak ? *peak * in_gpus : 0.0;
    peaks_known = peaks_known && peak && in_gpus > 0;
  }
  u.gpus = s.layout.num_gpus();
  if (peaks_known && gpus > 0) {
    u.peak_flops_per_gpu = peak_x_gpus / gpus;
    u.mfu = model_flops_utilisation(u.model_flops, s.makespan_s, u.gpus, u.peak_flops_per_gpu);
  }
  // Several pools are never one figure: the total blocks here, each pool's use per instance.
  if (instances_.size() > 1) s.kv_blocks = blocks;
  topology_->add_figures(s);
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
  topology_->check_nothing_lost();
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
  // Per-token work (hashing the prompt) only for a request that can be served at all.
  const FailReason why = topology_->arrival_failure(r);
  std::vector<BlockHash> hashes;
  if (topology_->entry(e.id).scheduler.config().enable_prefix_caching && why == FailReason::None) {
    if (client_prompts_)
      hash_token_blocks(client_prompts_->prompt(e.id), w_.engine.block_size, hash_root_, hashes);
    else
      hash_prompt_blocks(r, prompt_tokens_, w_.engine.block_size, hash_root_, hashes);
  }
  if (!topology_->add_request(e.id, now_, std::move(hashes))) on_request_left(r);
}

void Engine::on(const Submit& e) {
  if (e.id < 0) throw std::logic_error(fmt::format("engine: a Submit with request id {}", e.id));
  if (size_t(e.id) >= requests_.requests.size()) grow_open_table(size_t(e.id) + 1);
  Request& r = requests_.requests[size_t(e.id)];
  if (r.arrival != kNever) throw std::logic_error(fmt::format("engine: request slot {} submitted twice", e.id));
  r.arrival = now_;
  r.prompt_len = e.prompt_len;
  r.max_output = e.max_output;
  num_opened_ = std::max(num_opened_, size_t(e.id) + 1);
  on(Arrival{e.id});
}

void Engine::on(const Close&) { closed_ = true; }

// Doubling keeps the cost of growth amortised O(1) per request. Between events nothing holds a
// reference into the table, so the schedulers and the topology are handed the moved one here;
// the KV caches' block lists do not move (a plan in flight on another thread stays valid).
void Engine::grow_open_table(size_t min_size) {
  constexpr size_t kFirstSlots = 64;
  constexpr auto kMaxSlots = size_t(std::numeric_limits<ReqId>::max());  // ids are ReqId
  const size_t old = requests_.requests.size();
  if (min_size > kMaxSlots) throw std::logic_error(fmt::format("engine: request id {} out of range", min_size - 1));
  const size_t n = std::min(std::max({min_size, 2 * old, kFirstSlots}), kMaxSlots);
  requests_.requests.resize(n);
  for (size_t i = old; i < n; ++i) {
    requests_.requests[i].id = ReqId(i);
    requests_.requests[i].arrival = kNever;  // an unused slot
  }
  if (records_outputs_) outputs_.resize(n);
  const std::span<Request> all(requests_.requests);
  for (const auto& in : instances_) {
    in->kv.grow_requests(int32_t(n));
    in->scheduler.requests_moved(all);
  }
  topology_->requests_moved(all);
}

void Engine::token_reached_client(Request& r, Time at) {
  metrics_.on_token(r, at);
  for (run_observer_i* o : observers_) o->on_token(r, at);
}

void Engine::on(const Cancel& e) {
  Request& r = requests_.requests[size_t(e.id)];
  if (r.status == RequestStatus::Pending) {  // cancelled before arrival: ends at its arrival
    r.status = RequestStatus::Cancelled;
    r.finish = r.arrival;
    on_request_left(r);
    return;
  }
  if (topology_->cancel(e.id, now_)) on_request_left(r);
}

void Engine::on(const TransferDone& e) {
  end_async(-1, e.ticket);
  if (run_error_.empty()) topology_->transfer_done(e, now_);
}

void Engine::await_transfer(uint64_t ticket) { async_ops_.push_back({clock_.now() + async_timeout(), -1, ticket}); }

void Engine::on(const StepDone& e) {
  Instance& in = *instances_.at(size_t(e.instance));
  const StepPlan& plan = in.scheduler.current_plan();
  size_t k = 0;
  for (const ScheduledSeq& s : plan.seqs) {
    if (!s.samples) continue;
    Request& r = requests_.requests[size_t(s.id)];
    if (records_outputs_ && k < in.inflight_result.sampled.size())
      outputs_[size_t(s.id)].push_back(in.inflight_result.sampled[k]);
    if (!topology_->holds_token(in, r)) token_reached_client(r, now_);
    ++k;
  }
  in.inflight.tokens_at = now_;
  in.inflight.host = in.step_began < 0 ? -1 : std::max<Duration>(0, clock_.now() - in.step_began - in.inflight.elapsed);
  for (run_observer_i* o : observers_) o->on_step(in.inflight);
  topology_->step_done(in, now_);
}

void Engine::on(const StepFinished& e) {
  Instance& in = *instances_.at(size_t(e.instance));
  if (!in.scheduler.in_flight()) return;  // after a lost peer
  end_async(in.id, 0);
  in.inflight_result = e.result;
  const StepPlan& plan = in.scheduler.current_plan();
  check_step_result(in, plan);
  finish_record(in);
  in.last_step_end = now_;  // it ended when its answer came, whatever it computed for
  on(StepDone{in.id});
}

void Engine::end_async(int32_t instance, uint64_t ticket) {
  std::erase_if(async_ops_, [&](const AsyncOp& op) { return op.instance == instance && op.ticket == ticket; });
}

void Engine::check_deadlines() {
  const Time t = clock_.now();
  for (const AsyncOp& op : async_ops_)
    if (t >= op.deadline) {
      now_ = std::max(now_, t);
      on(PeerLost{op.instance >= 0 ? fmt::format("a step of instance {} got no answer from {} in {} ms", op.instance,
                                                 instances_[size_t(op.instance)]->executor.name(),
                                                 w_.disaggregation.channel.timeout_ms)
                                   : topology_->transfer_lost(op.ticket)});
      return;
    }
}

// The run cannot go on: every request still alive fails with the reason; blocks stay where they
// are (the run ends here, nothing is reused), and the summary carries the error.
void Engine::on(const PeerLost& e) {
  if (!run_error_.empty()) return;
  run_error_ = e.reason;
  // An open run's slots past the last Submit were never used.
  for (Request& r : std::span(requests_.requests).first(open_ ? num_opened_ : requests_.requests.size())) {
    if (!r.alive()) continue;
    r.fail_reason = e.fail;
    // One that had not arrived yet ends at its arrival (as a cancel before arrival does).
    r.finish = r.status == RequestStatus::Pending ? r.arrival : now_;
    r.status = RequestStatus::Failed;
    on_request_left(r);
  }
}

void Engine::start_idle_instances() {
  topology_->before_planning(now_);
  for (const auto& in : instances_)
    if (!in->scheduler.in_flight()) start_step(*in);
}

// Plan, execute, check, record, and post the step's end.
void Engine::start_step(Instance& in) {
  // The host part of a real step run here is timed on the wall clock (a simulated step's host,
  // or any step's under the virtual clock, is not on the timeline).
  const bool time_host = clock_.real() && !in.executor.simulated() && !in.executor.asynchronous();
  const Time began = time_host ? clock_.now() : -1;
  StepPlan& plan = in.scheduler.schedule(now_);
  if (plan.empty()) return;
  in.step_began = began;
  topology_->step_planned(in, plan);
  if (in.executor.needs_tokens()) attach_tokens(plan);
  plan.after_idle = in.num_steps == 0 || now_ - in.last_step_end >= kIdleGap;
  if (in.executor.asynchronous()) {  // its result comes back through the inbox (StepFinished)
    in.executor.submit(plan, num_steps_);
    // A step in another process has a deadline (a silent peer); one on a thread here ends or fails.
    async_ops_.push_back({in.executor.remote() ? clock_.now() + async_timeout() : kMaxTime, in.id, 0});
    in.inflight_result = StepResult{};
    record_step(in, plan);
    return;
  }
  try {
    in.inflight_result = in.executor.execute(plan);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("step {} at t={:.6f}s failed in the {} backend: {}", num_steps_,
                                         to_seconds(now_), in.executor.name(), e.what()));
  }
  check_step_result(in, plan);
  record_step(in, plan);
  finish_record(in);
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
        in.executor.simulated()
            ? make_cost_model(w_.model, specs_[size_t(in.id)].hardware, specs_[size_t(in.id)].engine.tp)->inputs()
            : "measured steps"));
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
}

// The step's time is known: its metrics, and when the instance is free again.
void Engine::finish_record(Instance& in) {
  StepRecord& rec = in.inflight;
  const StepPlan& plan = *rec.plan;
  rec.elapsed = in.inflight_result.elapsed;
  if (!in.shadow_cost_model) rec.cost = in.inflight_result.cost;
  metrics_.on_step(rec.elapsed, rec.kv_used, rec.kv_capacity, plan.num_decode_seqs, plan.num_prefill_seqs);
  const double u = rec.kv_capacity > 0 ? double(rec.kv_used) / rec.kv_capacity : 0.0;
  in.kv_used_time += u * double(rec.elapsed);
  in.busy_time += double(rec.elapsed);
  in.kv_peak = std::max(in.kv_peak, u);
  in.model_flops += step_flops(w_.model, plan).total();
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
      const int32_t n = prompt_end - s.num_computed_before;
      plan.tokens.resize(at + size_t(n));
      if (client_prompts_)
        std::copy_n(client_prompts_->prompt(s.id).begin() + s.num_computed_before, n, plan.tokens.data() + at);
      else
        prompt_tokens_.fill(r, s.num_computed_before, n, plan.tokens.data() + at);
    }
    for (int32_t p = std::max(s.num_computed_before, r.prompt_len); p < end; ++p)
      plan.tokens.push_back(out[size_t(p - r.prompt_len)]);
  }
}

void Engine::on_request_left(const Request& r) {
  for (run_observer_i* o : observers_) o->on_request_done(r);
}

}  // namespace tandem
