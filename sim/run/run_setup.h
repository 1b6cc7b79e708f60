// The one way a run is set up (issue #36, item 3): from a resolved workload to its instances
// (instance_specs, computed here once), their executors and the KV channel, the clock, the engine
// and its output files. `tandem run`, `tandem sweep`, the calibrations and the tests that run a
// workload end to end all come here, so a new piece of a run (a channel kind, a thread per
// instance, a worker process) is wired once for all of them.
//
// The requests are the caller's: start() takes them, so a caller whose requests do not come from
// the workload's `requests:` section (generate_requests) sets up a run the same way.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sim/engine/clock.h"
#include "sim/workload/config.h"
#include "sim/engine/engine.h"
#include "sim/run/executors.h"
#include "sim/outputs/outputs.h"
#include "sim/run/threaded_executor.h"
#include "sim/workload/workload_gen.h"

namespace tandem {

// Every field has a default, so that a caller names only what it sets ({.backend = "cpu"}).
struct RunSetupOptions {
  std::string backend = "sim";            // sim, cpu or cuda
  std::string clock = {};                 // wall or virtual; empty: virtual for the cost model, wall for a real backend
  int threads = 0;                        // the CPU backend's threads, passed on to a decode worker this run starts
  const ExecutorFactory* cuda = nullptr;  // a CUDA build's executors (cuda_executor_factory())
  const ChannelFactory* channels = nullptr;  // and its channels between two of them (cuda_channel_factory())
  // First-use costs paid before the first request (backend/warmup.h). Off only where measured
  // step times do not matter (tests): warming up changes no token.
  bool warm_up = true;
  // The emulated server (tandem serve --backend sim): the simulated executors under the wall
  // clock, each step taking its modelled time in real time. Elsewhere a simulated backend runs
  // under the virtual clock only.
  bool emulated = false;
};

// Holds what a run is made of, in the order it must be torn down: the engine holds the workload,
// the specs, the executors and the clock by reference, so a RunSetup never moves.
class RunSetup {
 public:
  // Builds the executors (a decode worker is started or reached here) and the clock; checks the
  // clock against the backend. Throws InputError for a combination the run cannot serve.
  RunSetup(Workload w, const RunSetupOptions& o);
  ~RunSetup();
  RunSetup(const RunSetup&) = delete;
  RunSetup& operator=(const RunSetup&) = delete;

  // The resolved workload; a checkpoint's model spec as the executors read it.
  Workload workload;
  std::vector<InstanceSpec> specs;  // instance_specs(workload), by instance id: the engine's too
  RunExecutors exec;                // one executor per instance, the KV channel, a decode worker
  std::string clock_name;           // "wall" or "virtual"
  std::unique_ptr<clock_i> clock;

  // The engine over `requests`: each executor warms up, then (wall clock, several instances)
  // computes on a thread of its own, and the threads' and the worker's answers go into the
  // engine's inbox. A real backend's steps are also priced by their cost model (steps.csv).
  Engine& start(RequestSet requests);
  // The executors' first-use costs (backend/warmup.h), once: start() calls it; a caller that must
  // be ready before it has requests (tandem serve, before it says it listens) calls it earlier.
  void warm_up_once();
  Engine& engine() { return *engine_; }
  // requests.csv, steps.csv, trace.json, summary.json into `dir`, as the engine runs.
  void write_outputs(const std::string& dir, TraceDetail trace);
  // After Engine::run: the worker's answers stop; the output files are completed.
  void finish(const Summary& s);
  // The threads a measured run computes on at once (host_probe.h's ConditionsProbe).
  int32_t measuring_threads() const;

 private:
  RunSetupOptions options_;
  std::vector<std::unique_ptr<ThreadedExecutor>> threaded_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<RunOutputs> outputs_;
  bool warmed_up_ = false;
};

}  // namespace tandem
