#include "sim/sweep/sweep_run.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/json_strict.h"
#include "sim/outputs/outputs_schema.h"
#include "sim/run/run_setup.h"
#include "sim/sweep/sweep_search.h"
#include "sim/workload/workload_gen.h"

namespace tandem {

const std::vector<std::string>& sweep_metric_columns() {
  static const std::vector<std::string> cols = [] {
    std::vector<std::string> c = {"requests.total", "requests.finished", "requests.failed", "requests.cancelled"};
    for (const char* m : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"})
      for (const char* p : {"mean", "p50", "p90", "p99"}) c.push_back(fmt::format("{}.{}", m, p));
    for (const char* k :
         {"queue_ms.mean", "queue_ms.p99", "throughput.requests_per_s", "throughput.output_tokens_per_s",
          "throughput.total_tokens_per_s", "goodput.fraction", "goodput.requests_per_s", "jitter_ms",
          "prefix_cache.hit_rate", "kv_cache.mean_util", "kv_cache.peak_util", "disaggregation.transfers.delivered",
          "disaggregation.transfer_ms.p50", "disaggregation.ttft_after_transfer_ms.p99", "steps", "makespan_s",
          "layout.num_instances", "layout.num_gpus"})
      c.push_back(k);
    // Utilisation: model_flops and mfu as summary.json has them (mfu empty where the peak is
    // unknown); the rest simulate_point sets from summary.json's instances.
    for (const char* k :
         {"utilisation.busy_max", "utilisation.kv_peak_max", "utilisation.prefill_busy", "utilisation.decode_busy",
          "utilisation.model_flops", "utilisation.mfu", "utilisation.prefill_mfu", "utilisation.decode_mfu"})
      c.push_back(k);
    return c;
  }();
  return cols;
}

Workload point_workload(const SweepPlan& plan, const SweepPoint& point, double rate, const Workload* parsed) {
  if (parsed) {
    Workload w = *parsed;
    if (plan.rate_key == "requests.arrival.rate" && !w.requests.trace &&
        w.requests.arrival.kind != ArrivalSpec::Kind::Burst) {
      w.requests.arrival.rate = rate;
      return w;
    }
    if (plan.rate_key == "requests.trace.rate_scale" && w.requests.trace) {
      w.requests.trace->rate_scale = rate;
      return w;
    }
  }
  return parse_workload(point.workload_yaml, plan.workload_path, {{plan.rate_key, fmt::format("{}", rate)}});
}

namespace {
// Reasons that hold whatever the arrival rate: the request cannot be served by this configuration.
bool fails_at_any_rate(FailReason r) {
  switch (r) {
    case FailReason::EmptyPrompt:
    case FailReason::EmptyOutput:
    case FailReason::ExceedsMaxModelLen:
    case FailReason::ExceedsKvCapacity:
    case FailReason::PromptOverBudget:
    case FailReason::NoStateSlots:
    case FailReason::ExceedsDecodeKvCapacity: return true;
    default: return false;
  }
}
}  // namespace

RunSloFigures slo_figures(std::span<const Request> requests, const Workload& w, const Summary& s) {
  RunSloFigures f;
  std::vector<double> ttft, tpot;
  int64_t good = 0;
  for (const Request& r : requests) {
    ++f.total;
    if (r.status == RequestStatus::Failed) {
      ++f.failed;
      ++f.failed_by_reason[std::string(to_string(r.fail_reason))];
      f.failed_at_any_rate += fails_at_any_rate(r.fail_reason);
      continue;
    }
    if (r.status == RequestStatus::Cancelled) ++f.cancelled;
    if (r.status != RequestStatus::Finished) continue;
    ++f.finished;
    // TTFT, TPOT and goodput as the run's summary counts them (MetricsRecorder::summarize).
    const double t_ttft = ttft_ms(r), t_tpot = tpot_ms(r);
    ttft.push_back(t_ttft);
    if (r.generated > 1) tpot.push_back(t_tpot);
    good += (w.slo.ttft_ms <= 0 || t_ttft <= w.slo.ttft_ms) && (w.slo.tpot_ms <= 0 || t_tpot <= w.slo.tpot_ms);
  }
  const int64_t unfinished = f.unfinished();
  f.ttft_p99_ms = p99_over_all(std::move(ttft), f.total);
  f.tpot_n = int64_t(tpot.size()) + unfinished;
  if (f.tpot_n > 0) f.tpot_p99_ms = p99_over_all(std::move(tpot), f.tpot_n);
  if (s.itl_ms.n > 0 || unfinished > 0)
    f.itl_p99_ms = nearest_rank(99, f.total) > f.finished ? std::numeric_limits<double>::infinity() : s.itl_ms.p99;
  f.goodput_fraction = f.total ? double(good) / double(f.total) : 0.0;
  return f;
}

PointRun simulate_point(Workload workload, double rate, const std::optional<std::string>& run_dir) {
  RunSetup run(std::move(workload), {.backend = "sim"});
  const Workload& w = run.workload;
  Engine& engine = run.start(generate_requests(w));
  if (run_dir) run.write_outputs(*run_dir, TraceDetail::None);
  const auto t0 = std::chrono::steady_clock::now();
  Summary s = engine.run();
  run.finish(s);
  const nlohmann::json full = summary_json(s, w);
  nlohmann::json metrics = nlohmann::json::object();
  for (const std::string& c : sweep_metric_columns())
    if (const nlohmann::json* v = json_at_path(full, c); v && v->is_number()) metrics[c] = *v;
  // Utilisation beside the point's figures: the busiest instance's share of the run in steps and
  // the fullest KV pool's peak (what limited a capacity), and in 1P1D each side's busy share.
  double busy_max = 0, kv_peak_max = 0;
  for (const InstanceFigures& f : s.instances) {
    busy_max = std::max(busy_max, f.busy_fraction);
    kv_peak_max = std::max(kv_peak_max, f.kv_peak_util);
    if (f.role == "prefill" || f.role == "decode") {
      metrics[fmt::format("utilisation.{}_busy", f.role)] = f.busy_fraction;
      if (f.mfu) metrics[fmt::format("utilisation.{}_mfu", f.role)] = *f.mfu;
    }
  }
  if (!s.instances.empty()) {
    metrics["utilisation.busy_max"] = busy_max;
    metrics["utilisation.kv_peak_max"] = kv_peak_max;
  }
  // GPUs by hardware (the instances' own in 1P1D), which a sweep's cost: section prices.
  nlohmann::json gpus_by_hardware = nlohmann::json::object();
  for (const InstanceLayout& in : engine.layout().instances) {
    const std::optional<HardwareSpec>* own = in.role == "prefill"  ? &w.disaggregation.prefill.hardware
                                             : in.role == "decode" ? &w.disaggregation.decode.hardware
                                                                   : nullptr;
    const std::string name = own && *own ? (**own).name : w.hardware.name;
    gpus_by_hardware[name] = gpus_by_hardware.value(name, 0) + in.gpus;
  }
  // The offered rate as the run's summary counts it (all requests by the last arrival).
  nlohmann::json out = {
      {"rate", rate}, {"offered_rate", s.offered_rate}, {"metrics", metrics}, {"layout", full["layout"]}};
  out["gpus_by_hardware"] = gpus_by_hardware;
  if (!s.failed_by_reason.empty()) out["failed_by_reason"] = s.failed_by_reason;
  out["wall_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {std::move(out), slo_figures(engine.requests(), w, s)};
}

std::vector<nlohmann::json> run_points(const SweepPlan& plan, const std::vector<int64_t>& indices,
                                       const SweepRunOptions& o) {
  struct State {
    const SweepPoint* point;
    std::optional<CapacitySearch> search;
    nlohmann::json runs = nlohmann::json::array();
    std::string error;
    bool started = false, done = false;
    std::shared_ptr<const Workload> parsed;  // the point's workload, parsed by its first run
    std::string at_any_rate;                 // why no rate meets the SLO (misses_at_any_rate), if so
  };
  std::vector<State> states;
  for (int64_t i : indices) {
    if (i < 0 || i >= int64_t(plan.points.size()))
      throw InputError(fmt::format("point {} is not in the plan (it has {})", i, plan.points.size()));
    State s{&plan.points[size_t(i)], {}, nlohmann::json::array(), "", false, false, nullptr, ""};
    if (plan.capacity) s.search.emplace(*plan.capacity);
    states.push_back(std::move(s));
  }
  // A point's result object, once it is done.
  const auto result_of = [&](State& s) {
    const SweepPoint& p = *s.point;
    nlohmann::json params = nlohmann::json::array();
    for (const auto& kv : p.params) params.push_back({kv.key, kv.value});
    // Runs in rate order: a capacity search's rounds are not.
    std::vector<nlohmann::json> runs(s.runs.begin(), s.runs.end());
    std::stable_sort(runs.begin(), runs.end(),
                     [](const nlohmann::json& a, const nlohmann::json& b) { return a["rate"] < b["rate"]; });
    // The point's layout (instances, GPUs, which first token TTFT counts): the same for each of its runs.
    nlohmann::json layout, gpus_by_hardware;
    for (auto& run : runs) {
      if (run.contains("layout") && layout.is_null()) layout = run["layout"];
      if (run.contains("gpus_by_hardware") && gpus_by_hardware.is_null()) gpus_by_hardware = run["gpus_by_hardware"];
      run.erase("layout");
      run.erase("gpus_by_hardware");
    }
    nlohmann::json r = {{"index", p.index}, {"key", p.key},        {"name", p.name},
                        {"params", params}, {"build", build_id()}, {"runs", runs}};
    if (!layout.is_null()) r["layout"] = layout;
    if (!gpus_by_hardware.is_null()) r["gpus_by_hardware"] = gpus_by_hardware;
    if (!s.error.empty()) {
      r["error"] = s.error;
    } else if (s.search) {
      const CapacitySearch::Result c = s.search->result();
      r["capacity"] = {{"status", CapacitySearch::status_name(c.status)},
                       {"rate", c.capacity},
                       {"first_missed", c.first_bad},
                       {"runs", c.runs}};
      if (c.status == CapacitySearch::Status::CannotFinish) r["capacity"]["why"] = s.at_any_rate;
    }
    return r;
  };
  std::vector<nlohmann::json> results(states.size());
  const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  // A queue of runs that threads take from; when a point's last outstanding run of a round ends,
  // the thread that ran it records the round in probe order (so the search does not depend on
  // the threads' timing), then queues the point's next probes or finishes the point. No barrier
  // between points: a point's next round starts as soon as its own round ends.
  struct Job {
    size_t state;
    double rate;
  };
  struct Round {
    std::vector<double> rates;
    std::vector<PointRun> out;
    std::vector<std::string> errors;
    size_t outstanding = 0;
  };
  std::vector<Round> rounds(states.size());
  std::deque<Job> queue;
  std::mutex mu;
  std::condition_variable cv;
  int64_t runs_done = 0, points_done = 0, open_points = int64_t(states.size());
  // Under mu: the point's next round queued, or the point finished.
  const auto advance = [&](size_t i) {
    State& s = states[i];
    std::vector<double> rates = s.search ? s.search->next() : (s.started ? std::vector<double>{} : plan.rates);
    s.started = true;
    if (!s.error.empty()) rates.clear();  // a point stops at its first failed run; its result says why
    if (rates.empty()) {
      s.done = true;
      ++points_done, --open_points;
      results[i] = result_of(s);
      if (o.on_point) o.on_point(results[i]);
      cv.notify_all();
      return;
    }
    rounds[i] =
        Round{rates, std::vector<PointRun>(rates.size()), std::vector<std::string>(rates.size()), rates.size()};
    for (double r : rates) queue.push_back({i, r});
    cv.notify_all();
  };
  {
    std::lock_guard lock(mu);
    for (size_t i = 0; i < states.size(); ++i) advance(i);
  }
  const auto worker = [&] {
    std::unique_lock lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return !queue.empty() || open_points == 0; });
      if (queue.empty()) return;
      const Job job = queue.front();
      queue.pop_front();
      const SweepPoint& p = *states[job.state].point;
      const std::shared_ptr<const Workload> parsed = states[job.state].parsed;  // read under mu
      lock.unlock();
      PointRun result;
      std::string error;
      std::shared_ptr<const Workload> mine;
      try {
        std::optional<std::string> dir;
        if (o.keep_dir) dir = fmt::format("{}/point-{}-rate-{}", *o.keep_dir, p.index, job.rate);
        Workload w = point_workload(plan, p, job.rate, parsed.get());
        if (!parsed) mine = std::make_shared<const Workload>(w);
        result = simulate_point(std::move(w), job.rate, dir);
      } catch (const std::exception& e) {
        error = fmt::format("rate {}: {}", job.rate, e.what());
      }
      lock.lock();
      if (mine && !states[job.state].parsed) states[job.state].parsed = std::move(mine);
      Round& rd = rounds[job.state];
      const size_t slot = size_t(std::find(rd.rates.begin(), rd.rates.end(), job.rate) - rd.rates.begin());
      rd.out[slot] = std::move(result);
      rd.errors[slot] = std::move(error);
      ++runs_done;
      if (--rd.outstanding == 0) {
        State& s = states[job.state];
        for (size_t k = 0; k < rd.rates.size(); ++k) {
          if (!rd.errors[k].empty()) {
            if (s.error.empty()) s.error = rd.errors[k];
            continue;
          }
          nlohmann::json& run = rd.out[k].out;
          if (plan.capacity) {
            const RunSloFigures& f = rd.out[k].slo;
            const SloVerdict v = meets_slo(plan.capacity->slo, f);
            std::string never;
            const bool at_any_rate = !v.ok && misses_at_any_rate(plan.capacity->slo, f, &never);
            if (at_any_rate && s.at_any_rate.empty()) s.at_any_rate = never;
            run["meets_slo"] = v.ok;
            if (!v.ok) run["why"] = v.why;
            s.search->record(rd.rates[k], v.ok, at_any_rate);
          }
          s.runs.push_back(std::move(run));
        }
        advance(job.state);
      }
      if (o.progress) o.progress(runs_done, points_done, int64_t(states.size()));
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  return results;
}

}  // namespace tandem
