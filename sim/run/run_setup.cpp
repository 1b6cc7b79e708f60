#include "sim/run/run_setup.h"

#include <fmt/format.h>

#include <algorithm>

#include "backend/cost_model.h"
#include "backend/cpu/kernels.h"
#include "backend/transfer/channel_kind.h"
#include "backend/warmup.h"

namespace tandem {

namespace {
// Checked before a decode worker is started or reached: its steps run in real time.
Workload with_clock_for_worker(Workload w, const RunSetupOptions& o) {
  if (o.clock == "virtual" && o.backend != "sim" && w.disaggregation.enabled &&
      channel_kind(w.disaggregation.channel.kind).remote_decode)
    throw InputError(
        fmt::format("--clock virtual: the {} channel's decode worker runs in real time; use the wall clock",
                    w.disaggregation.channel.kind));
  return w;
}
}  // namespace

RunSetup::RunSetup(Workload w, const RunSetupOptions& o)
    : workload(with_clock_for_worker(std::move(w), o)),
      specs(instance_specs(workload)),
      exec(make_run_executors(workload, specs, o.backend, o.cuda, o.threads, o.channels)),
      options_(o) {
  // A checkpoint's config may lower the model's max_model_len (the executors read it): the
  // schedulers keep to the model the executors serve.
  for (InstanceSpec& s : specs) s.scheduler.max_model_len = workload.model.max_model_len;
  clock_name = !o.clock.empty() ? o.clock : exec.simulated() ? "virtual" : "wall";
  if (clock_name != "wall" && clock_name != "virtual")
    throw InputError(fmt::format("--clock {}: expected wall or virtual", clock_name));
  if (clock_name == "wall" && exec.simulated() && !o.emulated)
    throw InputError("--clock wall needs a real backend (--backend cpu or cuda)");
  if (clock_name == "wall")
    clock = std::make_unique<WallClock>();
  else
    clock = std::make_unique<VirtualClock>();
}

RunSetup::~RunSetup() {
  // The threads and the worker post into the engine's inbox: they stop before the engine goes.
  for (auto& t : threaded_) t->stop();
  if (exec.remote) exec.remote->detach();
}

void RunSetup::warm_up_once() {
  // First-use costs (threads, buffers, cuBLAS, a graph per decode bucket) are paid here, not
  // by the first requests.
  if (warmed_up_ || !options_.warm_up) return;
  warmed_up_ = true;
  for (const InstanceSpec& in : specs)
    warm_up(*exec.executors[size_t(in.id)], warm_up_shape(instance_workload(workload, in)));
}

Engine& RunSetup::start(RequestSet requests) {
  warm_up_once();
  // The run's time 0 is after the warm-up: a wall clock made before it would start the run
  // late by the warm-up's length, its first arrivals already in the past.
  if (clock_name == "wall") clock = std::make_unique<WallClock>();
  // With the wall clock and several real instances, each local instance computes on a thread of
  // its own, so that prefill and decode steps overlap as on separate machines (a simulated one
  // computes nothing: its steps take only the modelled time the loop waits).
  if (clock_name == "wall" && !exec.simulated() && exec.executors.size() > 1)
    for (size_t i = 0; i < exec.executors.size(); ++i)
      if (!exec.executors[i]->asynchronous()) {
        threaded_.push_back(std::make_unique<ThreadedExecutor>(*exec.executors[i], int32_t(i)));
        exec.executors[i] = threaded_.back().get();
      }
  engine_ = std::make_unique<Engine>(workload, specs, std::move(requests), exec.executors, *clock, exec.channel);
  // The decode worker's answers and the threads' results go into the engine's inbox while the
  // engine lives (the destructor stops them).
  if (exec.remote) exec.remote->attach(engine_->inbox());
  for (auto& t : threaded_) t->attach(engine_->inbox());
  if (!exec.simulated())
    for (const InstanceSpec& in : specs)
      engine_->set_shadow_cost_model(size_t(in.id), make_cost_model(workload.model, in.hardware, in.engine.tp));
  return *engine_;
}

void RunSetup::write_outputs(const std::string& dir, TraceDetail trace) {
  const RunLayout layout = engine_->layout();
  outputs_ = std::make_unique<RunOutputs>(dir, trace, &layout);
  engine_->add_observer(outputs_.get());
}

void RunSetup::finish(const Summary& s) {
  if (exec.remote) exec.remote->detach();
  if (outputs_) outputs_->finish(*engine_, s, workload);
}

// The instances' threads (the CPU backend's threads, at least one per TP rank; a GPU instance's
// host thread), summed when the instances overlap (several under the wall clock, a child decode
// worker included), else the largest. A decode worker at `peer` is not this run's: it computes
// on its own host's cores (on this host, its CPU time reads as other work's; README, "Measured
// under contention").
int32_t RunSetup::measuring_threads() const {
  const bool decode_at_peer = workload.disaggregation.enabled && !workload.disaggregation.channel.peer.empty();
  int32_t sum = 0, most = 0;
  for (const InstanceSpec& in : specs) {
    if (decode_at_peer && in.role == InstanceRole::Decode) continue;
    const int32_t t = options_.backend == "cpu" ? std::max(cpu::threads(), int32_t(in.engine.tp)) : 1;
    sum += t;
    most = std::max(most, t);
  }
  return clock_name == "wall" && exec.executors.size() > 1 ? sum : most;
}

}  // namespace tandem
