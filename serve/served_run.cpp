#include "serve/served_run.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "backend/cost_model.h"
#include "backend/cpu/kernels.h"
#include "serve/tokenizer.h"
#include "sim/workload_gen.h"

namespace tandem::serve {

void LiveStats::Histogram::add(double v) {
  size_t i = 0;
  while (i < bounds.size() && v > bounds[i]) ++i;
  ++counts[i];
  sum += v;
  ++count;
}

// vLLM's buckets (vllm/v1/metrics/loggers.py) for its TTFT, inter-token and e2e histograms.
LiveStats::LiveStats()
    : ttft({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
            1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}),
      itl({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}),
      e2e({0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
           30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}) {}

ServedRun::ServedRun(Workload& w, const ServeOptions& o) : w_(w), o_(o) {
  if (o.max_requests < 1) throw InputError(fmt::format("--max-requests {}: must be at least 1", o.max_requests));
  if (o.backend == "cpu") cpu::set_threads(o.threads);
  run_ = make_run_executors(w, o.backend, cuda_executor_factory(), o.threads, cuda_channel_factory());
  // As `tandem run` under the wall clock: first-use costs before the first client, and with
  // several instances each computes on a thread of its own (the simulated executor needs neither:
  // its steps take no time to compute, only the modelled time the loop then waits).
  const std::vector<InstanceSpec> specs = instance_specs(w);
  if (!run_.simulated())
    for (const InstanceSpec& in : specs)
      warm_up(*run_.executors[size_t(in.id)], warm_up_shape(instance_workload(w, in)));
  if (!run_.simulated() && run_.executors.size() > 1)
    for (size_t i = 0; i < run_.executors.size(); ++i)
      if (!run_.executors[i]->asynchronous()) {
        threaded_.push_back(std::make_unique<ThreadedExecutor>(*run_.executors[i], int32_t(i)));
        run_.executors[i] = threaded_.back().get();
      }
  prompts_.resize(size_t(o.max_requests));
  delivered_.resize(size_t(o.max_requests));
  kv_use_.resize(specs.size());
}

ServedRun::~ServedRun() {
  if (thread_.joinable()) thread_.join();
  for (auto& t : threaded_) t->stop();
  if (run_.remote) run_.remote->detach();
}

void ServedRun::start(std::function<void()> done) {
  RequestSet slots;
  slots.requests.resize(size_t(o_.max_requests));
  for (size_t i = 0; i < slots.requests.size(); ++i) {
    slots.requests[i].id = ReqId(i);
    slots.requests[i].arrival = kNever;  // an unused slot
  }
  start_steady_ns_ =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  clock_ = std::make_unique<WallClock>();
  engine_ = std::make_unique<Engine>(w_, std::move(slots), run_.executors, *clock_, run_.channel);
  engine_->open_arrivals(this);
  if (run_.remote) run_.remote->attach(engine_->inbox());
  for (auto& t : threaded_) t->attach(engine_->inbox());
  if (!run_.simulated())
    for (const InstanceSpec& in : instance_specs(w_))
      engine_->set_shadow_cost_model(size_t(in.id), make_cost_model(w_.model, in.hardware, in.engine.tp));
  if (o_.out) {
    const RunLayout layout = engine_->layout();
    outputs_ = std::make_unique<RunOutputs>(*o_.out, o_.trace, &layout);
    engine_->add_observer(outputs_.get());
  }
  engine_->add_observer(this);
  thread_ = std::thread([this, done = std::move(done)] {
    try {
      summary_ = engine_->run();
    } catch (const std::exception& e) {
      error_ = e.what();
    }
    done();
  });
}

Summary ServedRun::finish() {
  if (thread_.joinable()) thread_.join();
  for (auto& t : threaded_) t->stop();
  if (run_.remote) run_.remote->detach();
  if (!error_.empty()) throw std::runtime_error(error_);
  summary_.clock = "wall";
  if (outputs_) outputs_->finish(*engine_, summary_, w_);
  return summary_;
}

ReqId ServedRun::submit(std::vector<Token> prompt, int32_t max_output) {
  if (next_slot_ >= o_.max_requests) return -1;
  const ReqId id = next_slot_++;
  const auto len = int32_t(prompt.size());
  prompts_[size_t(id)] = std::move(prompt);  // before the Submit: the inbox's lock orders the two
  ++num_alive_;
  engine_->inbox().post(Submit{id, len, max_output});
  return id;
}

// Running: requests alive that a step has taken (under PD, also while parked or moving); waiting:
// the other requests alive (submitted, never scheduled yet). Exact at every step and every end.
void ServedRun::on_step(const StepRecord& r) {
  for (const ScheduledSeq& s : r.plan->seqs) {
    Delivered& d = delivered_[size_t(s.id)];
    if (!d.scheduled) {
      d.scheduled = true;
      ++num_scheduled_alive_;
    }
  }
  const auto i = size_t(r.instance);
  kv_use_[i] = r.kv_capacity > 0 ? double(r.kv_used) / r.kv_capacity : 0.0;
  stats_.kv_usage = *std::max_element(kv_use_.begin(), kv_use_.end());
  publish_counts();
}

void ServedRun::publish_counts() {
  stats_.running = num_scheduled_alive_;
  stats_.waiting = std::max<int64_t>(0, num_alive_.load() - num_scheduled_alive_);
}

void ServedRun::on_token(const Request& r, Time at) {
  Delivered& d = delivered_[size_t(r.id)];
  const int32_t k = d.tokens++;
  const Time previous = d.last;
  d.last = at;
  const auto& out = engine_->outputs();
  const Token t = out.empty() ? emulated_token(k) : out[size_t(r.id)][size_t(k)];
  if (outbox_) outbox_->push({Note::Kind::Token, RequestStatus::Running, FailReason::None, r.id, t, at});
  std::lock_guard lock(stats_.mu);
  ++stats_.generation_tokens;
  if (k == 0)
    stats_.ttft.add(to_seconds(at - r.arrival));
  else
    stats_.itl.add(to_seconds(at - previous));
}

void ServedRun::on_request_done(const Request& r) {
  prompts_[size_t(r.id)] = {};
  num_scheduled_alive_ -= delivered_[size_t(r.id)].scheduled;
  --num_alive_;
  publish_counts();
  if (outbox_) outbox_->push({Note::Kind::End, r.status, r.fail_reason, r.id, 0, r.finish});
  std::lock_guard lock(stats_.mu);
  stats_.finished += r.status == RequestStatus::Finished;
  stats_.cancelled += r.status == RequestStatus::Cancelled;
  stats_.failed += r.status == RequestStatus::Failed;
  if (r.first_scheduled != kNever) {
    stats_.prompt_tokens += r.prompt_len;
    stats_.prefix_queries += r.prompt_len;
    stats_.prefix_hits += r.num_cached_tokens;
  }
  if (r.status == RequestStatus::Finished) stats_.e2e.add(to_seconds(r.finish - r.arrival));
  if (engine_->topology().moves_kv()) {
    const RequestTransfer t = engine_->topology().transfer_of(r.id);
    if (t.end != kNever) {
      ++stats_.transfers;
      stats_.transfer_bytes += t.bytes;
    }
  }
}

}  // namespace tandem::serve
