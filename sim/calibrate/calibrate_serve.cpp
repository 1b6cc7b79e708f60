#include "sim/calibrate/calibrate_serve.h"

#include <fmt/format.h>

#include <algorithm>

#include "sim/run/run_setup.h"

namespace tandem {

// A backend's factory is given for cuda only; cpu is built here.
std::unique_ptr<executor_i> executor_for(Workload& w, const ExecutorFactory* factory) {
  return make_executor(w, factory ? "cuda" : "cpu", factory);
}

ServedRun serve(Workload workload, const ExecutorFactory* factory, const cost_model_i* predictor) {
  RunSetup setup(std::move(workload), {.backend = factory ? "cuda" : "cpu", .clock = "wall", .cuda = factory});
  const Workload& w = setup.workload;
  Engine& e = setup.start(generate_requests(w));
  struct Collect : run_observer_i {
    const cost_model_i* predictor = nullptr;
    ServedRun run;
    std::vector<Time> start, end;
    void on_step(const StepRecord& r) override {
      run.points.push_back({plan_features(*r.plan), to_seconds(r.elapsed), r.plan->after_idle});
      ServedStep s{step_kind(*r.plan), r.plan->after_idle, start.empty(), to_seconds(r.elapsed), 0,
                   refine_size(*r.plan)};
      if (predictor) {
        StepPlan plan = *r.plan;  // priced as if back to back: the idle factor is fitted from these
        plan.after_idle = false;
        s.predicted_s = predictor->estimate(plan).total_s();
      }
      run.steps.push_back(s);
      start.push_back(r.start);
      end.push_back(r.start + r.elapsed);
    }
  } collect;
  collect.predictor = predictor;
  e.add_observer(&collect);
  fmt::print(stderr, "calibrate: serving {} (real time, {} requests)\n", w.path, e.requests().size());
  e.run();
  // The simulator runs back-to-back steps with no gap, but a real loop spends time between
  // them (planning, recording). Charge it to the step before: a step followed at once by
  // another counts from its start to the next start; others get the median such gap.
  ServedRun& run = collect.run;
  auto& p = run.points;
  std::vector<Duration> gaps;
  for (size_t i = 0; i + 1 < p.size(); ++i)
    if (!p[i + 1].after_idle) gaps.push_back(collect.start[i + 1] - collect.end[i]);
  std::sort(gaps.begin(), gaps.end());
  run.loop_gap_s = gaps.empty() ? 0.0 : to_seconds(gaps[gaps.size() / 2]);
  for (size_t i = 0; i < p.size(); ++i) {
    p[i].seconds = (i + 1 < p.size() && !p[i + 1].after_idle) ? to_seconds(collect.start[i + 1] - collect.start[i])
                                                              : p[i].seconds + run.loop_gap_s;
    run.steps[i].measured_s = p[i].seconds;
  }
  fmt::print(stderr, "calibrate: engine loop time between back-to-back steps: median {:.1f} us\n",
             run.loop_gap_s * 1e6);
  return run;
}

}  // namespace tandem
