// tandem calibrate --model: the per-operator profile. Synthetic steps of controlled shapes run
// through the backend's ordinary executor (the serving path: metadata upload, launches or
// graph replay, the result copy), timed back to back and after idle spells; derive_curves()
// turns the step totals into per-operator-class curves. Then, with --workload, served traffic
// refines it (loop gap, residual per step kind, idle factor from real idle spells).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "backend/warmup.h"
#include "policies/kv_cache.h"
#include "sim/calibrate/calibrate.h"
#include "sim/engine/engine.h"
#include "sim/base/host_probe.h"

namespace tandem {

namespace {
struct Shape {
  ProfileStep step;    // kind, seqs, tokens, context, sampled, idle
  int32_t prompt = 0;  // mixed: the prompt's tokens (step.tokens is the decodes' 1)
};

// The plan of a shape; block tables from `next` up, every sequence its own blocks (a shared
// context would sit in cache and read faster than a real batch's).
StepPlan plan_of(const Shape& sh, int32_t bs, std::vector<std::vector<int32_t>>& tables) {
  const ProfileStep& s = sh.step;
  // (context, new tokens, prompt length): decodes (and a mixed step's running sequences) have
  // their prompt behind them; every other sequence is a prompt or a prompt's chunk.
  struct Seq {
    int32_t context, tokens, prompt_len;
  };
  std::vector<Seq> seqs;
  if (s.kind == "mixed") seqs.push_back({0, sh.prompt, sh.prompt});
  const bool decodes = s.kind == "decode" || s.kind == "mixed";
  for (int32_t i = 0; i < s.seqs; ++i)
    seqs.push_back({s.context, s.tokens, decodes ? s.context : s.context + s.tokens});
  tables.assign(seqs.size(), {});
  StepPlan p;
  int32_t next = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Seq& q = seqs[i];
    for (int32_t b = 0; b < blocks_for(q.context + q.tokens, bs); ++b) tables[i].push_back(next++);
    p.add({ReqId(i), q.tokens, q.context, s.sampled || s.kind == "mixed", tables[i]}, q.prompt_len);
  }
  p.tokens.assign(size_t(p.num_tokens), Token(1));
  return p;
}

int32_t blocks_needed(const Shape& sh, int32_t bs) {
  const ProfileStep& s = sh.step;
  return s.seqs * blocks_for(s.context + s.tokens, bs) + (s.kind == "mixed" ? blocks_for(sh.prompt, bs) : 0);
}

std::vector<Shape> grid(const GridLimits& L, bool quick) {
  std::vector<Shape> g;
  const int32_t cap_tokens = L.num_blocks * L.block_size;
  const auto fits = [&](const Shape& s) { return blocks_needed(s, L.block_size) <= L.num_blocks; };
  const auto add = [&](Shape s) {
    if (fits(s)) g.push_back(s);
  };
  const int32_t max_n = std::min({L.max_tokens, L.max_model_len, cap_tokens});
  std::vector<int32_t> ns;
  for (int32_t n = 1; n < max_n; n *= 2) ns.push_back(n);
  ns.push_back(max_n);
  for (int32_t n : ns) {
    add({{"prefill", 1, n, 0, false, false, 0}});
    // A cached context long enough for its attention to show next to the linear work.
    const int32_t c =
        std::min({quick ? 1024 : 2048, L.max_model_len - n, cap_tokens - n}) / L.block_size * L.block_size;
    if (c >= std::max(64, n / 4)) add({{"prefill", 1, n, c, false, false, 0}});
  }
  std::vector<int32_t> ss;
  for (int32_t s = 1; s < L.max_seqs; s *= 2) ss.push_back(s);
  ss.push_back(L.max_seqs);
  for (int32_t r : ss)
    if (2 * r <= L.max_tokens)
      for (bool sampled : {false, true}) add({{"multi", r, 2, 0, sampled, false, 0}});
  // Decode contexts every factor of 2-4: the cost is not linear in context (on the CPU it bends
  // where the KV stops fitting in cache; with only 32, 512 and 2,048, a served decode step at
  // 800 tokens was priced 40 % high: reports/simulation-fidelity/report.md, second round).
  for (int32_t s : ss)
    for (int32_t c : {32, 128, 512, 1024, 2048}) {
      const int32_t ctx = std::min(c, L.max_model_len - 1);
      if (quick && c == 2048) continue;
      add({{"decode", s, 1, ctx, true, false, 0}});
    }
  // A prompt joining running decodes: the measure of the mixed correction (measured / composed
  // by the prompt's tokens and the decodes; the composition alone was off by -14 to +12 % on the
  // CPU, and more so with more decodes).
  for (int32_t prompt : {32, 128, 512, 1024})
    for (int32_t s : {4, 16, 32})
      if (prompt + s <= L.max_tokens && s + 1 <= L.max_seqs && prompt + 512 < L.max_model_len &&
          !(quick && prompt == 1024))
        add({{"mixed", s, 1, 512, true, false, 0}, prompt});
  return g;
}

// The reference shape, timed before and after the grid: a decode step of about 8 sequences at a
// mid context (the bulk of served steps), else the first shape.
size_t reference_shape(const std::vector<Shape>& shapes) {
  size_t best = 0;
  double dist = INFINITY;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const ProfileStep& s = shapes[i].step;
    if (s.kind != "decode") continue;
    if (const double d = std::fabs(std::log(double(s.seqs) / 8)) + std::fabs(std::log(double(s.context) / 512));
        d < dist) {
      dist = d;
      best = i;
    }
  }
  return best;
}

std::string shape_name(const ProfileStep& s, int32_t prompt) {
  if (s.kind == "mixed") return fmt::format("mixed {}-token prompt + {} decodes @{}", prompt, s.seqs, s.context);
  return fmt::format("{} {}x{} @{}{}", s.kind, s.seqs, s.tokens, s.context, s.sampled ? " sampled" : "");
}
}  // namespace

void repetition_agreement(const std::vector<std::vector<double>>& sorted_times, const std::vector<std::string>& names,
                          CalibrationConditions& c) {
  std::vector<double> gaps;
  double worst = -1;
  c.repeat_over = 0;
  c.repeat_worst.clear();
  for (size_t i = 0; i < sorted_times.size(); ++i) {
    const std::vector<double>& t = sorted_times[i];
    if (t.size() < 2 || t[0] * 1e3 < kRepeatMinMs) continue;
    const double g = t[1] / t[0] - 1;
    gaps.push_back(g);
    if (g > kRepeatBound) ++c.repeat_over;
    if (g > worst) {
      worst = g;
      c.repeat_worst = fmt::format("{}: +{:.1f} %", i < names.size() ? names[i] : "?", 100 * g);
    }
  }
  c.repeat_compared = int32_t(gaps.size());
  if (gaps.empty()) {
    c.repeat_median = -1;
    return;
  }
  std::sort(gaps.begin(), gaps.end());
  c.repeat_median = gaps[gaps.size() / 2];
}

std::string contention_refusal(const CalibrationConditions& c) {
  std::string why;
  const auto add = [&](const std::string& s) { why += (why.empty() ? "" : "; ") + s; };
  if (c.cpu_share_grid >= 0 && c.cpu_share_grid < kMinCpuShare)
    add(fmt::format("the grid had its CPU cores {:.0f} % of its time (at least {:.0f} % needed): other work took them",
                    100 * c.cpu_share_grid, 100 * kMinCpuShare));
  if (c.repeat_compared >= kRepeatOverMinShapes && c.repeat_over > kRepeatOverShareMax * c.repeat_compared &&
      c.repeat_median <= kRepeatMedianMax)
    add(fmt::format("{} of {} shapes' two fastest repetitions differ by more than {:.0f} % (at most {:.0f} % of them; "
                    "median +{:.1f} %, worst {})",
                    c.repeat_over, c.repeat_compared, 100 * kRepeatBound, 100 * kRepeatOverShareMax,
                    100 * c.repeat_median, c.repeat_worst));
  if (c.repeat_compared > 0 && c.repeat_median > kRepeatMedianMax)
    add(fmt::format("the shapes' two fastest repetitions differ by +{:.1f} % at the median (at most {:.0f} %; {} of {} "
                    "beyond {:.0f} %, worst {})",
                    100 * c.repeat_median, 100 * kRepeatMedianMax, c.repeat_over, c.repeat_compared,
                    100 * kRepeatBound, c.repeat_worst));
  if (c.reference_before_ms > 0 && c.reference_after_ms > 0) {
    const double d = c.reference_after_ms / c.reference_before_ms - 1;
    if (std::fabs(d) > kReferenceBound)
      add(fmt::format("the reference step ({}) took {:.3f} ms before the grid and {:.3f} ms after ({:+.1f} %, more "
                      "than {:.0f} %)",
                      c.reference, c.reference_before_ms, c.reference_after_ms, 100 * d, 100 * kReferenceBound));
  }
  return why;
}

OperatorProfile measure_operator_profile(executor_i& exec, const GridLimits& L, const GridOptions& o) {
  const std::vector<Shape> shapes = grid(L, o.quick);
  int32_t max_blocks = 0;
  for (const Shape& s : shapes) max_blocks = std::max(max_blocks, blocks_needed(s, L.block_size));
  const auto t_start = std::chrono::steady_clock::now();
  const auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  };
  WarmUpShape ws{L.num_blocks, L.block_size, L.max_tokens, L.max_seqs, L.max_model_len};
  const int warm = warm_up(exec, ws);
  // Real-looking K/V in every block the grid reads (a GPU runs faster on zeros). The CPU
  // store is written with zeros at start-up (its pages are real), and fp32 arithmetic does
  // not depend on the values, so its fill is skipped: it would cost minutes on a big model.
  if (o.fill_kv) {
    std::vector<std::vector<int32_t>> tables;
    const int32_t per_seq = 128, seqs = std::max(1, std::min(L.max_seqs, L.max_tokens / per_seq));
    for (int32_t b0 = 0; b0 < max_blocks; b0 += seqs * per_seq / L.block_size) {
      StepPlan p;
      tables.assign(size_t(seqs), {});
      for (int32_t i = 0; i < seqs; ++i) {
        for (int32_t b = 0; b < per_seq / L.block_size; ++b)
          tables[size_t(i)].push_back(std::min(L.num_blocks - 1, b0 + i * per_seq / L.block_size + b));
        p.add({ReqId(i), per_seq, 0, false, tables[size_t(i)]}, per_seq);
      }
      for (int32_t t = 0; t < p.num_tokens; ++t) p.tokens.push_back(Token((t * 7919 + b0) % std::max(2, L.vocab)));
      exec.execute(p);
    }
  }
  fmt::print(stderr, "calibrate: {} warm-up steps, K/V {}, {:.1f} s; {} grid shapes\n", warm,
             o.fill_kv ? "filled" : "as allocated", elapsed(), shapes.size());
  std::vector<std::vector<std::vector<int32_t>>> tables(shapes.size());
  std::vector<StepPlan> plans;
  std::vector<std::string> names;
  for (size_t i = 0; i < shapes.size(); ++i) {
    plans.push_back(plan_of(shapes[i], L.block_size, tables[i]));
    names.push_back(shape_name(shapes[i].step, shapes[i].prompt));
  }
  const auto time_step = [&](size_t i) {
    const StepResult r = exec.execute(plans[i]);
    return to_seconds(r.elapsed);
  };
  // Contention: the reference shape (median of 5, after one untimed run) before and after the
  // grid, and the machine's CPU time that other processes used meanwhile.
  CalibrationConditions cond;
  const size_t ref = reference_shape(shapes);
  const auto time_reference = [&] {
    time_step(ref);
    std::vector<double> t;
    for (int k = 0; k < 5; ++k) t.push_back(time_step(ref));
    std::sort(t.begin(), t.end());
    return t[2] * 1e3;
  };
  cond.reference = names[ref];
  cond.reference_before_ms = time_reference();
  const CpuSample cpu0 = cpu_sample();
  // Round-robin repetitions: a burst of interference touches one repetition of many shapes,
  // and each shape's median drops it. Round 0 warms the shapes' buffers and is not kept.
  // Within a round a shape runs twice and the second run is kept: served traffic repeats a
  // shape step after step (weights and buffers in cache), which the step before, of another
  // shape, would otherwise have evicted (a cold step is slower: reports/before-stage4/report.md).
  std::vector<std::vector<double>> times(shapes.size());
  std::vector<double> warm_round(shapes.size());  // round 0's kept (second) runs
  int reps = std::max(1, o.reps);
  for (int r = 0; r <= reps; ++r) {
    const double t0 = elapsed();
    for (size_t i = 0; i < shapes.size(); ++i) {
      time_step(i);
      const double s = time_step(i);
      if (r > 0)
        times[i].push_back(s);
      else
        warm_round[i] = s;
    }
    const double round_s = elapsed() - t0;
    fmt::print(stderr, "calibrate: round {}/{} of {} shapes: {:.1f} s (total {:.1f} s)\n", r, reps, shapes.size(),
               round_s, elapsed());
    // Bounded in time: fewer repetitions rather than a grid that overruns its budget. When not
    // even one more round fits (a slow or instrumented build), round 0's second runs are kept:
    // each already followed a run of its own shape, so its buffers were warm.
    if (r == 0 && o.budget_s > 0) {
      const int fit = int((o.budget_s * 0.85 - elapsed()) / std::max(round_s, 1e-6));
      if (fit < 1) {
        for (size_t i = 0; i < shapes.size(); ++i) times[i].push_back(warm_round[i]);
        reps = 0;
        fmt::print(stderr, "calibrate: no repetition fits in the {:.0f} s budget: round 0 is kept\n", o.budget_s);
        break;
      }
      if (fit < reps) {
        reps = fit;
        fmt::print(stderr, "calibrate: {} repetitions fit in the {:.0f} s budget\n", reps, o.budget_s);
      }
    }
  }
  const CpuShares shares = cpu_shares(cpu0, cpu_sample());
  cond.others_grid = shares.others;
  cond.steal_grid = shares.steal;
  if (o.cpu_threads > 0 && shares.own_cores >= 0) cond.cpu_share_grid = shares.own_cores / o.cpu_threads;
  cond.reference_after_ms = time_reference();
  for (std::vector<double>& t : times) std::sort(t.begin(), t.end());
  repetition_agreement(times, names, cond);
  fmt::print(stderr,
             "calibrate: conditions: other processes used {} of the machine's CPU time during the grid, steal {}{}; "
             "reference ({}) {:.3f} ms before, {:.3f} ms after\n",
             shares.others < 0 ? "?" : fmt::format("{:.1f} %", 100 * shares.others),
             shares.steal < 0 ? "?" : fmt::format("{:.1f} %", 100 * shares.steal),
             cond.cpu_share_grid < 0 ? "" : fmt::format("; the grid had its cores {:.1f} % of the time", 100 * cond.cpu_share_grid),
             cond.reference,
             cond.reference_before_ms, cond.reference_after_ms);
  if (cond.repeat_compared > 0)
    fmt::print(stderr,
               "calibrate: repetitions: the second fastest over the fastest, median +{:.1f} % over {} shapes; {} "
               "beyond {:.0f} % (worst {})\n",
               100 * cond.repeat_median, cond.repeat_compared, cond.repeat_over, 100 * kRepeatBound, cond.repeat_worst);
  OperatorProfile p;
  p.conditions = cond;
  p.graph_buckets = o.graph_buckets;
  p.mixed_fit = true;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ProfileStep s = shapes[i].step;
    if (s.kind == "mixed") s.tokens = shapes[i].prompt;  // the file records the prompt's size
    // The fastest repetition: interference from elsewhere only ever slows a step down, and on
    // a shared machine it can last longer than a round. The shape of the curves comes from
    // here; the level the served traffic actually sees is the residual (--workload).
    s.seconds = times[i][0];
    p.raw.push_back(s);
  }
  // After-idle: a few small shapes (where waking up matters most) after 20 ms of sleep.
  std::vector<size_t> idle_shapes;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const ProfileStep& s = shapes[i].step;
    if ((s.kind == "decode" && s.context == std::min(512, L.max_model_len - 1) && s.seqs <= 16) ||
        (s.kind == "prefill" && s.context == 0 && s.tokens >= 16 && s.tokens <= 256))
      idle_shapes.push_back(i);
  }
  std::vector<double> ratios;
  for (int r = 0; r < o.idle_rounds && !idle_shapes.empty(); ++r)
    for (size_t i : idle_shapes) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ProfileStep s = p.raw[i];
      s.idle = true;
      s.seconds = time_step(i);
      ratios.push_back(s.seconds / p.raw[i].seconds);
      p.raw.push_back(s);
    }
  p.idle_samples = int32_t(ratios.size());
  p.idle_factor = idle_factor_of(ratios);
  fmt::print(stderr, "calibrate: grid done in {:.1f} s ({} repetitions, {} after-idle samples: idle factor {:.3f})\n",
             elapsed(), reps, ratios.size(), p.idle_factor);
  derive_curves(p);
  return p;
}

OperatorProfile measure_until_agreed(const std::function<OperatorProfile()>& measure_grid,
                                     std::chrono::milliseconds pause) {
  for (int32_t attempt = 1;; ++attempt) {
    OperatorProfile p = measure_grid();
    p.conditions.grid_tries = attempt;
    const std::string why = contention_refusal(p.conditions);
    if (why.empty() || attempt == kGridTries) return p;
    fmt::print(stderr, "calibrate: grid {} of at most {} would be refused ({}); measuring it again\n", attempt,
               kGridTries, why);
    std::this_thread::sleep_for(pause);  // a burst of other work may pass
  }
}

double idle_factor_of(std::vector<double> ratios) {
  if (int(ratios.size()) < kMinIdleSamples) return 1.0;
  std::sort(ratios.begin(), ratios.end());
  return std::clamp(ratios[ratios.size() / 2], 0.5, 10.0);
}

}  // namespace tandem
