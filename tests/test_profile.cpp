// The profiled (per-operator) cost model: interpolation, the curves derived from a raw table
// of a known operator model, the profile file's round trip and its errors, warm-up shapes,
// and the residual fit on served steps.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "backend/cost_model.h"
#include "backend/warmup.h"
#include "sim/calibrate/calibrate.h"
#include "sim/workload/config.h"
#include "sim/workload/config_sections.h"

using namespace tandem;

TEST_CASE("Curve interpolates linearly between knots and extrapolates past both ends, never below zero") {
  const Curve c{{1, 2, 4}, {10, 20, 20}};
  CHECK(c.at(1) == 10);
  CHECK(c.at(1.5) == doctest::Approx(15));
  CHECK(c.at(2) == 20);
  CHECK(c.at(3) == doctest::Approx(20));
  CHECK(c.at(100) == doctest::Approx(20));  // the last segment is flat
  CHECK(c.at(0.5) == doctest::Approx(5));   // the first segment, extended
  CHECK(c.at(-5) == 0);                     // clamped at zero
  const Curve up{{1, 2}, {1, 3}};
  CHECK(up.at(10) == doctest::Approx(19));  // linear past the end: a compute-bound GEMM
  const Curve down{{1, 2}, {1, 0}};
  CHECK(down.at(3) == 0);
  CHECK(Curve{{5}, {7}}.at(100) == 7);
  CHECK(Curve{}.at(3) == 0);
}

namespace {
// A known operator model, not linear in tokens (a kink at 256 tokens, as a GEMM going from
// memory- to compute-bound), to derive the curves from and check them against.
struct Truth {
  static double linear(double T) { return 1e-3 + 2e-6 * T + (T > 256 ? 8e-6 * (T - 256) : 0.0); }
  static double lm(double R) { return 4e-4 + 1e-5 * R; }
  static double seq_extra(double S) { return 2e-5 * (S - 1); }
  static constexpr double pair = 1e-9, dec_key = 3e-9;
  // A step of (context, new tokens, sampled) sequences.
  static double step(const std::vector<std::tuple<int, int, bool>>& seqs) {
    double T = 0, R = 0, attn = 0;
    for (auto [c, n, s] : seqs) {
      T += n;
      R += s;
      attn += (n == 1 && s) ? dec_key * (c + 1) : pair * n * (c + (n + 1) / 2.0);
    }
    return linear(T) + lm(R) * (R > 0) + seq_extra(double(seqs.size())) + attn;
  }
};

OperatorProfile truth_profile() {
  OperatorProfile p;
  p.backend = "cpu";
  p.model = "tiny";
  for (int n = 1; n <= 2048; n *= 2) {
    p.raw.push_back({"prefill", 1, n, 0, false, false, Truth::step({{0, n, false}})});
    p.raw.push_back({"prefill", 1, n, 1024, false, false, Truth::step({{1024, n, false}})});
  }
  for (int r = 1; r <= 64; r *= 2)
    for (bool s : {false, true}) {
      std::vector<std::tuple<int, int, bool>> seqs(size_t(r), {0, 2, s});
      p.raw.push_back({"multi", r, 2, 0, s, false, Truth::step(seqs)});
    }
  for (int s = 1; s <= 64; s *= 2)
    for (int c : {32, 512, 2048}) {
      std::vector<std::tuple<int, int, bool>> seqs(size_t(s), {c, 1, true});
      p.raw.push_back({"decode", s, 1, c, true, false, Truth::step(seqs)});
    }
  derive_curves(p);
  return p;
}

StepPlan plan_of(const std::vector<std::tuple<int, int, bool>>& seqs) {
  StepPlan p;
  for (auto [c, n, s] : seqs) p.add({ReqId(p.seqs.size()), n, c, s, {}}, implied_prompt_len(c, n));
  return p;
}
}  // namespace

TEST_CASE("the curves derived from step totals recover the operators, and compose steps the grid never ran") {
  const auto p = std::make_shared<OperatorProfile>(truth_profile());
  CHECK(p->linear.at(300) == doctest::Approx(Truth::linear(300)).epsilon(1e-9));
  CHECK(p->linear.at(64) == doctest::Approx(Truth::linear(64)).epsilon(1e-9));
  CHECK(p->lm_head.at(8) == doctest::Approx(Truth::lm(8)).epsilon(1e-9));
  CHECK(p->seq_overhead.at(16) == doctest::Approx(Truth::seq_extra(16)).epsilon(1e-6));
  CHECK(p->prefill_attn.at(512) == doctest::Approx(Truth::pair).epsilon(1e-6));
  const ProfiledCostModel m(p);
  const std::vector<std::vector<std::tuple<int, int, bool>>> held_out = {
      {{700, 1, true}},                                                  // decode, off-grid context
      std::vector<std::tuple<int, int, bool>>(24, {900, 1, true}),       // decode, off-grid batch
      {{0, 300, true}},                                                  // a whole prompt, sampled
      {{1500, 200, false}},                                              // a chunk over a cached prefix
      {{0, 400, true}, {100, 1, true}, {2000, 1, true}, {37, 1, true}},  // mixed
      {{0, 64, true}, {0, 64, true}, {0, 64, true}},                     // static batching's prefill
  };
  for (const auto& seqs : held_out) {
    CAPTURE(seqs.size());
    CHECK(m.estimate(plan_of(seqs)).total_s() == doctest::Approx(Truth::step(seqs)).epsilon(1e-6));
  }
}

TEST_CASE("profiled model: CUDA graph buckets, the idle factor and the residuals per step kind") {
  auto p = std::make_shared<OperatorProfile>(truth_profile());
  const std::vector<std::tuple<int, int, bool>> d33(33, {100, 1, true});
  const double plain = ProfiledCostModel(p).estimate(plan_of(d33)).total_s();
  p->graph_buckets = true;  // 33 sequences run as 64: the fixed part of 64, attention of 33
  const double bucket = ProfiledCostModel(p).estimate(plan_of(d33)).total_s();
  const std::vector<std::tuple<int, int, bool>> d64(64, {100, 1, true});
  const double full64 = Truth::step(d64);
  CHECK(bucket > plain);
  CHECK(bucket == doctest::Approx(full64 - 31 * Truth::dec_key * 101).epsilon(1e-6));
  p->graph_buckets = false;
  p->idle_factor = 1.5;
  p->refine_mixed = 1.2;
  p->loop_gap_s = 1e-5;
  StepPlan mixed = plan_of({{0, 100, true}, {50, 1, true}});
  const double base = Truth::step({{0, 100, true}, {50, 1, true}}) + 1e-5;
  CHECK(step_kind(mixed) == StepKind::Mixed);
  CHECK(ProfiledCostModel(p).estimate(mixed).total_s() == doctest::Approx(base * 1.2).epsilon(1e-6));
  mixed.after_idle = true;
  CHECK(ProfiledCostModel(p).estimate(mixed).total_s() == doctest::Approx(base * 1.2 * 1.5).epsilon(1e-6));
}

TEST_CASE("refine_profile: a residual needs enough steps of its kind, an idle factor enough idle spells") {
  OperatorProfile p = truth_profile();
  std::vector<ServedStep> steps;
  steps.push_back({StepKind::Prefill, true, true, 0.5, 0.01});  // the first step: ignored
  for (int i = 0; i < 30; ++i) steps.push_back({StepKind::Decode, false, false, 1.1 * (0.010 + 1e-4), 0.010});
  for (int i = 0; i < 5; ++i) steps.push_back({StepKind::Prefill, false, false, 2.0 * 0.02, 0.02});
  // A heavy tail moves the residual (a total), not only the typical step.
  for (int i = 0; i < 30; ++i) steps.push_back({StepKind::Mixed, false, false, (i == 0 ? 31.0 : 1.0) * 0.0201, 0.02});
  for (int i = 0; i < 3; ++i) steps.push_back({StepKind::Decode, true, false, 0.03, 0.010});
  const std::string notes = refine_profile(p, steps, 1e-4);
  CHECK(p.refine_decode == doctest::Approx(1.1));
  CHECK(p.refine_mixed == doctest::Approx(2.0));  // (31 + 29) / 30
  // 5 prefill steps < kMinRefineSteps: the pooled residual of all 65 back-to-back steps.
  const double pooled = (30 * 1.1 * 0.0101 + 5 * 0.04 + 60 * 0.0201) / (30 * 0.0101 + 5 * 0.0201 + 30 * 0.0201);
  CHECK(p.refine_prefill == doctest::Approx(pooled));
  CHECK(p.refine_prefill != doctest::Approx(1.0));
  CHECK(p.idle_factor == 1.0);  // 3 after-idle steps < kMinIdleSamples
  CHECK(p.loop_gap_s == 1e-4);
  CHECK(notes.find("residual prefill: " + fmt::format("{:.4f}", pooled) + ", pooled over the 65 back-to-back") !=
        std::string::npos);
  for (int i = 0; i < kMinIdleSamples; ++i) steps.push_back({StepKind::Decode, true, false, 0.0202, 0.010});
  refine_profile(p, steps, 1e-4);
  // Totals over all 11 after-idle steps against their refined prediction (decode residual 1.1).
  CHECK(p.idle_factor ==
        doctest::Approx((3 * 0.03 + kMinIdleSamples * 0.0202) / ((3 + kMinIdleSamples) * 0.0101 * 1.1)));
  CHECK(idle_factor_of({3, 3, 3}) == 1.0);
  // Too few steps of every kind together: no residual at all.
  OperatorProfile q = truth_profile();
  const std::vector<ServedStep> few(kMinRefineSteps - 1, {StepKind::Decode, false, false, 0.02, 0.01});
  const std::string few_notes = refine_profile(q, few, 0);
  CHECK(q.refine_decode == 1.0);
  CHECK(q.refine_prefill == 1.0);
  CHECK(few_notes.find("residual decode: 1 (19 back-to-back steps of this kind and 19 of every kind") !=
        std::string::npos);
  CHECK(idle_factor_of(std::vector<double>(kMinIdleSamples, 50.0)) == 10.0);  // capped
}

TEST_CASE("refine_profile: a residual per size class where served traffic has enough steps of it") {
  OperatorProfile p = truth_profile();
  std::vector<ServedStep> steps;
  // One-sequence decodes run 20 % under their prediction, two-sequence ones 25 % over (the CPU's
  // pattern, reports/simulation-fidelity/report.md); 3-4 sequences too few for a class of their own.
  for (int i = 0; i < 40; ++i) steps.push_back({StepKind::Decode, false, false, 0.8 * 0.010, 0.010, 1});
  for (int i = 0; i < 30; ++i) steps.push_back({StepKind::Decode, false, false, 1.25 * 0.012, 0.012, 2});
  for (int i = 0; i < 5; ++i) steps.push_back({StepKind::Decode, false, false, 1.0 * 0.015, 0.015, 4});
  for (int i = 0; i < 25; ++i) steps.push_back({StepKind::Prefill, false, false, 1.1 * 0.05, 0.05, 200});
  const std::string notes = refine_profile(p, steps, 0);
  REQUIRE(p.refine_by_size[int(StepKind::Decode)].size() == 2);
  CHECK(p.refine_by_size[int(StepKind::Decode)][0].upto == 1);
  CHECK(p.refine_by_size[int(StepKind::Decode)][0].factor == doctest::Approx(0.8));
  CHECK(p.refine_by_size[int(StepKind::Decode)][0].steps == 40);
  CHECK(p.refine_by_size[int(StepKind::Decode)][1].upto == 2);
  CHECK(p.refine_by_size[int(StepKind::Decode)][1].factor == doctest::Approx(1.25));
  REQUIRE(p.refine_by_size[int(StepKind::Prefill)].size() == 1);
  CHECK(p.refine_by_size[int(StepKind::Prefill)][0].upto == 256);  // 200 tokens: the class (128, 256]
  CHECK(p.refine_by_size[int(StepKind::Mixed)].empty());
  CHECK(notes.find("residual decode by size (sequences up to: residual (steps)): 1: 0.8000 (40), 2: 1.2500 (30)") !=
        std::string::npos);
  // The kind's residual is the total over every size; a size without a class of its own takes it.
  const double kind = (40 * 0.8 * 0.010 + 30 * 1.25 * 0.012 + 5 * 0.015) / (40 * 0.010 + 30 * 0.012 + 5 * 0.015);
  CHECK(p.refine_decode == doctest::Approx(kind));
  CHECK(refine_factor(p, StepKind::Decode, 1) == doctest::Approx(0.8));
  CHECK(refine_factor(p, StepKind::Decode, 2) == doctest::Approx(1.25));
  p.refine_by_size[int(StepKind::Decode)].push_back({8, 0.5, 20});
  CHECK(refine_factor(p, StepKind::Decode, 3) == doctest::Approx(1.25));  // classes 2 and 8 equally near: 2
  CHECK(refine_factor(p, StepKind::Decode, 5) == doctest::Approx(0.5));   // (4, 8]: its own
  p.refine_by_size[int(StepKind::Decode)].pop_back();
  // A size without a class of its own takes the nearest kept class (in powers of two; ties: the
  // smaller), not the kind's total; a kind without any class, the kind's residual.
  CHECK(refine_factor(p, StepKind::Decode, 3) == doctest::Approx(1.25));   // (2, 4]: nearest is 2
  CHECK(refine_factor(p, StepKind::Decode, 64) == doctest::Approx(1.25));  // beyond every class: the largest
  CHECK(refine_factor(p, StepKind::Prefill, 129) == doctest::Approx(1.1));
  CHECK(refine_factor(p, StepKind::Prefill, 1) == doctest::Approx(1.1));   // below every class: the smallest
  CHECK(refine_factor(p, StepKind::Mixed, 200) == doctest::Approx(p.refine_mixed));
  CHECK(p.refine_mixed != doctest::Approx(1.0));
  // The cost model applies it: a one-sequence decode priced at 0.8 of the grid, a two-sequence one at 1.25.
  auto q = std::make_shared<OperatorProfile>(p);
  auto bare = std::make_shared<OperatorProfile>(truth_profile());
  const std::vector<std::tuple<int, int, bool>> one{{300, 1, true}}, two{{300, 1, true}, {40, 1, true}};
  CHECK(ProfiledCostModel(q).estimate(plan_of(one)).total_s() ==
        doctest::Approx(0.8 * ProfiledCostModel(bare).estimate(plan_of(one)).total_s()).epsilon(1e-9));
  CHECK(ProfiledCostModel(q).estimate(plan_of(two)).total_s() ==
        doctest::Approx(1.25 * ProfiledCostModel(bare).estimate(plan_of(two)).total_s()).epsilon(1e-9));
}

TEST_CASE("calibrate measures a grid again while it would be refused, up to kGridTries grids") {
  const auto grid = [](int32_t over) {
    OperatorProfile p;
    p.conditions.repeat_compared = 40;
    p.conditions.repeat_over = over;
    p.conditions.repeat_median = 0.02;
    return p;
  };
  int calls = 0;
  const OperatorProfile second = measure_until_agreed([&] { return grid(++calls == 1 ? 20 : 1); }, {});
  CHECK(calls == 2);
  CHECK(second.conditions.grid_tries == 2);
  CHECK(second.conditions.repeat_over == 1);
  calls = 0;
  const OperatorProfile last = measure_until_agreed([&] { return ++calls, grid(20); }, {});
  CHECK(calls == kGridTries);
  CHECK(last.conditions.grid_tries == kGridTries);
  CHECK_FALSE(contention_refusal(last.conditions).empty());  // still refused: calibrate then exits 3
  calls = 0;
  CHECK(measure_until_agreed([&] { return ++calls, grid(0); }, {}).conditions.grid_tries == 1);
  CHECK(calls == 1);
}

namespace {
std::string write_file(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / ("tandem_test_profile_" + name);
  std::ofstream(path) << text;
  return path.string();
}

std::string workload_with(const std::string& profile, const std::string& model = "tiny", int tp = 1) {
  return fmt::format(
      "model: {}\nhardware: {}\nengine: {{num_kv_blocks: 64, tp: {}}}\n"
      "requests: {{count: 1, arrival: {{process: burst}}, prompt_len: 4, output_len: 2}}\n",
      model, profile, tp);
}

std::string load_error(const std::string& workload_text) {
  try {
    parse_workload(workload_text, "w.yaml");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("a profile file round trip keeps the raw table, its provenance and every prediction") {
  OperatorProfile p = truth_profile();
  p.hardware = "test CPU, 2 threads";
  p.code_version = "abc123";
  p.measured_at = "2026-12-01T00:00:00Z";
  p.threads = 2;
  p.idle_factor = 1.25;
  p.idle_samples = 12;
  p.loop_gap_s = 3.5e-5;
  p.refine_decode = 1.01;
  p.refine_mixed = 0.97;
  p.raw.push_back({"mixed", 4, 128, 512, true, false, 0.0123});
  p.raw.push_back({"decode", 1, 1, 512, true, true, 0.0042});
  p.conditions.load_before = 1.25;
  p.conditions.others_grid = 0.375;
  p.conditions.cpu_share_grid = 0.985;
  p.conditions.reference = "decode 8x1 @512 sampled";
  p.conditions.reference_before_ms = 3.5;
  p.conditions.reference_after_ms = 3.75;
  p.conditions.repeat_median = 0.0125;
  p.conditions.repeat_over = 2;
  p.conditions.repeat_compared = 40;
  p.conditions.repeat_worst = "prefill 1x64 @0: +12.0 %";
  p.conditions.accepted_noisy = true;
  p.conditions.grid_tries = 2;
  p.refine_by_size[int(StepKind::Decode)] = {{1, 0.8, 40}, {4, 1.125, 25}};
  p.refine_by_size[int(StepKind::Mixed)] = {{256, 1.0625, 21}};
  const std::string path = write_file("roundtrip.yaml", config_detail::profile_file_text(p, "t", 16, "# a test\n"));
  const Workload w = parse_workload(workload_with(path), "w.yaml");
  REQUIRE(w.hardware.profiled);
  const OperatorProfile& q = *w.hardware.profiled;
  CHECK(q.hardware == p.hardware);
  CHECK(q.code_version == p.code_version);
  CHECK(q.measured_at == p.measured_at);
  CHECK(q.idle_factor == p.idle_factor);
  CHECK(q.idle_samples == 12);
  CHECK(q.loop_gap_s == doctest::Approx(p.loop_gap_s).epsilon(1e-12));
  CHECK(q.refine_mixed == p.refine_mixed);
  CHECK(q.conditions.load_before == 1.25);
  CHECK(q.conditions.load_after == -1);  // unknown stays unknown
  CHECK(q.conditions.others_grid == 0.375);
  CHECK(q.conditions.others_serving == -1);
  CHECK(q.conditions.cpu_share_grid == 0.985);
  CHECK(q.conditions.reference == p.conditions.reference);
  CHECK(q.conditions.reference_after_ms == 3.75);
  CHECK(q.conditions.repeat_median == 0.0125);
  CHECK(q.conditions.repeat_over == 2);
  CHECK(q.conditions.repeat_compared == 40);
  CHECK(q.conditions.repeat_worst == p.conditions.repeat_worst);
  CHECK(q.conditions.accepted_noisy);
  CHECK(q.conditions.grid_tries == 2);
  for (int k = 0; k < 3; ++k) {
    CAPTURE(k);
    REQUIRE(q.refine_by_size[k].size() == p.refine_by_size[k].size());
    for (size_t i = 0; i < p.refine_by_size[k].size(); ++i) {
      CHECK(q.refine_by_size[k][i].upto == p.refine_by_size[k][i].upto);
      CHECK(q.refine_by_size[k][i].factor == p.refine_by_size[k][i].factor);
      CHECK(q.refine_by_size[k][i].steps == p.refine_by_size[k][i].steps);
    }
  }
  REQUIRE(q.raw.size() == p.raw.size());
  for (size_t i = 0; i < p.raw.size(); ++i) {
    CAPTURE(i);
    CHECK(q.raw[i].kind == p.raw[i].kind);
    CHECK(q.raw[i].seqs == p.raw[i].seqs);
    CHECK(q.raw[i].tokens == p.raw[i].tokens);
    CHECK(q.raw[i].context == p.raw[i].context);
    CHECK(q.raw[i].sampled == p.raw[i].sampled);
    CHECK(q.raw[i].idle == p.raw[i].idle);
    CHECK(q.raw[i].seconds == doctest::Approx(p.raw[i].seconds).epsilon(1e-11));
  }
  const auto a = make_cost_model(w.model, w.hardware);
  const ProfiledCostModel b(std::make_shared<OperatorProfile>(p));
  for (const auto& seqs : std::vector<std::vector<std::tuple<int, int, bool>>>{
           {{700, 1, true}}, {{0, 300, true}, {5, 1, true}}, {{1500, 200, false}}})
    CHECK(a->estimate(plan_of(seqs)).total_s() == doctest::Approx(b.estimate(plan_of(seqs)).total_s()).epsilon(1e-11));
  // validate prints the path, which loads again, and the reference steps' predictions.
  const std::string y = to_yaml(w);
  CHECK(y.find(path) != std::string::npos);
  CHECK(y.find("# predicted step times (ms), profiled") != std::string::npos);
  CHECK(parse_workload(y, "again.yaml").hardware.profiled);
}

TEST_CASE("calibrate's contention checks: repetitions that disagree, a reference step that moved") {
  CalibrationConditions c;
  // 10 shapes of 1-10 ms: the two fastest agree within 2 % ...
  std::vector<std::vector<double>> t;
  std::vector<std::string> names;
  for (int i = 1; i <= 10; ++i) {
    t.push_back({i * 1e-3, i * 1.02e-3, i * 1.5e-3});
    names.push_back(fmt::format("shape {}", i));
  }
  t.push_back({1e-4, 2e-4});  // ... a step under kRepeatMinMs is not compared (timer jitter) ...
  t.push_back({5e-3});        // ... nor a shape with one repetition
  names.resize(t.size(), "other");
  repetition_agreement(t, names, c);
  CHECK(c.repeat_compared == 10);
  CHECK(c.repeat_over == 0);
  CHECK(c.repeat_median == doctest::Approx(0.02));
  CHECK(contention_refusal(c).empty());
  // A few shapes beyond 10 % are counted and the worst named, but the median shape decides.
  t[3][1] = t[3][0] * 1.3;
  t[8][1] = t[8][0] * 1.5;
  repetition_agreement(t, names, c);
  CHECK(c.repeat_over == 2);
  CHECK(c.repeat_worst == "shape 9: +50.0 %");
  CHECK(contention_refusal(c).empty());
  // A third beyond 10 % while the median shape agrees within 2 %: refused (more than a quarter).
  t[6][1] = t[6][0] * 1.25;
  repetition_agreement(t, names, c);
  CHECK(c.repeat_over == 3);
  CHECK(c.repeat_median == doctest::Approx(0.02));
  CHECK(contention_refusal(c).find("3 of 10 shapes' two fastest repetitions differ by more than 10 % (at most 25 % of "
                                   "them; median +2.0 %, worst shape 9: +50.0 %)") != std::string::npos);
  t[6][1] = t[6][0] * 1.02;
  {  // the share is judged over kRepeatOverMinShapes shapes at least: 3 of 7 is not refused
    CalibrationConditions few;
    repetition_agreement({t[3], t[8], t[6], t[0], t[1], t[2], t[4]}, {"a", "b", "c", "d", "e", "f", "g"}, few);
    few.repeat_over = 3;
    CHECK(few.repeat_compared == 7);
    CHECK(contention_refusal(few).empty());
  }
  for (int i : {0, 1, 2, 4, 5}) t[size_t(i)][1] = t[size_t(i)][0] * 1.19;  // the median shape: +19 %
  repetition_agreement(t, names, c);
  CHECK(c.repeat_median == doctest::Approx(0.19));
  CHECK(contention_refusal(c).find("7 of 10 shapes' two fastest repetitions differ by more than 10 %") !=
        std::string::npos);
  for (int i : {0, 1, 2, 4, 5}) t[size_t(i)][1] = t[size_t(i)][0] * 1.21;  // +21 %: refused
  repetition_agreement(t, names, c);
  CHECK(contention_refusal(c).find("the shapes' two fastest repetitions differ by +21.0 % at the median (at most "
                                   "20 %; 7 of 10 beyond 10 %, worst shape 9: +50.0 %)") != std::string::npos);
  CHECK(contention_refusal(c).find("shapes' two fastest repetitions differ by more than") == std::string::npos);
  // The grid's CPU share (the CPU backend): a grid that waited for its core is refused.
  CalibrationConditions s;
  s.cpu_share_grid = 0.95;
  CHECK(contention_refusal(s).empty());
  s.cpu_share_grid = 0.66;
  CHECK(contention_refusal(s).find("the grid had its CPU cores 66 % of its time (at least 90 % needed)") !=
        std::string::npos);
  s.cpu_share_grid = -1;  // unknown (no /proc, or another backend): not checked
  CHECK(contention_refusal(s).empty());
  // The reference: within 40 % kept, beyond refused (either way: contention that eased is as bad).
  CalibrationConditions r;
  r.reference = "decode 8x1 @512";
  r.reference_before_ms = 4.0;
  r.reference_after_ms = 5.5;
  CHECK(contention_refusal(r).empty());
  r.reference_after_ms = 2.0;
  CHECK(contention_refusal(r).find("the reference step (decode 8x1 @512) took 4.000 ms before the grid and 2.000 ms "
                                   "after (-50.0 %") != std::string::npos);
  // One repetition: nothing to compare, nothing refused.
  CalibrationConditions one;
  repetition_agreement({{1e-3}, {2e-3}}, {"a", "b"}, one);
  CHECK(one.repeat_compared == 0);
  CHECK(one.repeat_worst.empty());
  repetition_agreement(t, names, one);  // the same record filled again: nothing stale stays
  repetition_agreement({{1e-3}}, {"a"}, one);
  CHECK(one.repeat_worst.empty());
  CHECK(one.repeat_median == -1);
  CHECK(contention_refusal(one).empty());
}

TEST_CASE("mixed_fit: the grid's mixed shapes correct the composition of mixed steps, by prefill tokens and decodes") {
  OperatorProfile p = truth_profile();
  // Truth composes exactly; the "measured" mixed shapes are, with 4 decodes, 1.2x it at a
  // 128-token prompt and 0.9x at 512; with 16 decodes 1.4x and 1.1x.
  const auto mixed_truth = [](int prompt, int seqs) {
    std::vector<std::tuple<int, int, bool>> s{{0, prompt, true}};
    s.resize(size_t(seqs) + 1, {512, 1, true});
    return Truth::step(s);
  };
  for (int seqs : {4, 16}) {
    const double more = seqs == 16 ? 0.2 : 0.0;
    p.raw.push_back({"mixed", seqs, 128, 512, true, false, (1.2 + more) * mixed_truth(128, seqs)});
    p.raw.push_back({"mixed", seqs, 512, 512, true, false, (0.9 + more) * mixed_truth(512, seqs)});
  }
  derive_curves(p);
  CHECK(p.mixed_factor.empty());  // not a mixed_fit profile: the shapes are only checks
  const auto plain = std::make_shared<OperatorProfile>(p);
  p.mixed_fit = true;
  derive_curves(p);
  REQUIRE(p.mixed_decodes == std::vector<double>{4, 16});
  REQUIRE(p.mixed_factor.size() == 2);
  CHECK(p.mixed_factor[0].x == std::vector<double>{128, 512});
  CHECK(p.mixed_factor[0].y[0] == doctest::Approx(1.2));
  CHECK(p.mixed_factor[1].y[1] == doctest::Approx(1.1));
  const ProfiledCostModel fit(std::make_shared<OperatorProfile>(p)), checks(plain);
  const auto ratio = [&](const std::vector<std::tuple<int, int, bool>>& seqs) {
    return fit.estimate(plan_of(seqs)).total_s() / checks.estimate(plan_of(seqs)).total_s();
  };
  const std::tuple<int, int, bool> dec{700, 1, true};
  CHECK(ratio({{0, 128, true}, dec}) == doctest::Approx(1.2));                 // 1 decode: held at 4
  CHECK(ratio({{0, 320, true}, dec, {90, 1, true}}) == doctest::Approx(1.05));  // halfway in tokens
  CHECK(ratio({{0, 2000, true}, dec}) == doctest::Approx(0.9));                // held, not extrapolated
  CHECK(ratio({{0, 16, true}, {300, 1, true}}) == doctest::Approx(1.2));
  std::vector<std::tuple<int, int, bool>> ten{{0, 128, true}};
  ten.resize(11, dec);
  CHECK(ratio(ten) == doctest::Approx(1.3));  // 10 decodes: halfway between 4 and 16
  std::vector<std::tuple<int, int, bool>> many{{0, 512, true}};
  many.resize(31, dec);
  CHECK(ratio(many) == doctest::Approx(1.1));  // 30 decodes: held at 16
  CHECK(ratio({{0, 128, true}}) == doctest::Approx(1.0));  // a prefill-only step: not corrected
  CHECK(ratio({dec, {30, 1, true}}) == doctest::Approx(1.0));  // decode-only
  // The grid's own mixed shapes come out as measured; the flag survives the file.
  for (const ProfileStep& s : p.raw)
    if (s.kind == "mixed") CHECK(fit.estimate(plan_of_profile_step(s)).total_s() == doctest::Approx(s.seconds));
  const std::string path = write_file("mixed_fit.yaml", config_detail::profile_file_text(p, "t", 16, ""));
  const Workload w = parse_workload(workload_with(path), "w.yaml");
  CHECK(w.hardware.profiled->mixed_fit);
  CHECK(mixed_correction(*w.hardware.profiled, 320, 10) == doctest::Approx(mixed_correction(p, 320, 10)));
  CHECK(mixed_correction(*plain, 320, 10) == 1.0);
}

TEST_CASE("tp > 1: a step's all-reduces measured by size, priced apart from the linear work, the total unchanged") {
  // measure_allreduce: two all-reduces per layer of tokens x hidden floats, at each size.
  struct Counting final : communicator_i {
    std::vector<size_t> sizes;
    int size() const override { return 2; }
    void all_reduce_sum(std::span<float* const> b, size_t n) override {
      CHECK(b.size() == 2);
      sizes.push_back(n);
    }
  } comm;
  const std::vector<ProfileStep> ar = measure_allreduce(comm, 256, 4, {1, 64}, 3);
  REQUIRE(ar.size() == 2);
  CHECK(ar[0].kind == "allreduce");
  CHECK(ar[1].tokens == 64);
  CHECK(ar[1].seconds > 0);
  // per size: a warm step and 3 timed ones, each 2 x 4 layers
  CHECK(std::count(comm.sizes.begin(), comm.sizes.end(), size_t(256)) == 4 * 8);
  CHECK(std::count(comm.sizes.begin(), comm.sizes.end(), size_t(64 * 256)) == 4 * 8);
  struct One final : communicator_i {
    int size() const override { return 1; }
    void all_reduce_sum(std::span<float* const>, size_t) override { FAIL("tp 1 has no all-reduce"); }
  } one;
  CHECK(measure_allreduce(one, 256, 4, {1, 64}, 3).empty());

  OperatorProfile p = truth_profile();
  p.tp = 2;
  const ProfiledCostModel without(std::make_shared<OperatorProfile>(p));
  p.raw.push_back({"allreduce", 1, 1, 0, false, false, 2e-5});
  p.raw.push_back({"allreduce", 1, 1024, 0, false, false, 4e-4});
  derive_curves(p);
  const ProfiledCostModel with(std::make_shared<OperatorProfile>(p));
  for (const auto& seqs : std::vector<std::vector<std::tuple<int, int, bool>>>{
           {{700, 1, true}}, {{0, 300, true}, {5, 1, true}}, {{1500, 200, false}}}) {
    const StepPlan plan = plan_of(seqs);
    const StepCost a = without.estimate(plan), b = with.estimate(plan);
    CAPTURE(plan.num_tokens);
    CHECK(a.comm_s == 0);
    CHECK(b.comm_s == doctest::Approx(p.allreduce.at(plan.num_tokens)));  // interpolated by tokens
    CHECK(b.comm_s > 0);
    CHECK(b.total_s() == doctest::Approx(a.total_s()).epsilon(1e-12));
  }
  // The file keeps them; a tp 1 profile with allreduce entries is refused at the entry.
  const std::string path = write_file("allreduce.yaml", config_detail::profile_file_text(p, "t", 16, ""));
  const Workload w = parse_workload(workload_with(path, "tiny", 2), "w.yaml");
  CHECK(w.hardware.profiled->allreduce.x.size() == 2);
  std::string text = config_detail::profile_file_text(p, "t", 16, "");
  text.replace(text.find("tp: 2"), 5, "tp: 1");
  const std::string bad = write_file("allreduce_tp1.yaml", text);
  CHECK(load_error(workload_with(bad)).find("allreduce entries belong to a profile measured at tp > 1") !=
        std::string::npos);
}

TEST_CASE("a bad profile file is refused naming the file, the line and the field") {
  const OperatorProfile p = truth_profile();
  const std::string good = config_detail::profile_file_text(p, "t", 16, "");
  const auto replaced = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t at = s.find(from);
    REQUIRE(at != std::string::npos);
    return s.replace(at, from.size(), to);
  };
  struct Case {
    std::string name, text, expect;
  };
  const std::vector<Case> cases = {
      {"kind", replaced("kind: multi", "kind: multy"),
       "field 'hardware.profiled.raw[24].kind': unknown step kind 'multy'"},
      {"ms", replaced(", ms: ", ", ms: -"), "field 'hardware.profiled.raw[0].ms'"},
      {"tokens", replaced("{kind: decode, seqs: 1, tokens: 1", "{kind: decode, seqs: 1, tokens: 2"),
       "field 'hardware.profiled.raw[38].tokens': a decode step has one token per sequence"},
      {"nodecode", good.substr(0, good.rfind('\n', good.find("{kind: decode")) + 1),
       "field 'hardware.profiled.raw': needs decode steps"},
      {"nomodel", replaced("  model: tiny\n", ""), "field 'hardware.profiled.model': missing"},
      {"extra", replaced("  tp: 1\n", "  tp: 1\n  peak_tflops: 3\n"),
       "field 'hardware.profiled.peak_tflops': unknown field"},
      {"both", replaced("profiled:", "fitted: {}\nprofiled:"),
       "field 'hardware.profiled': a profile is either fitted or profiled"},
      {"class", replaced("  raw:", "  refine_by_size: {decode: [{upto: 3, factor: 1.1, steps: 30}]}\n  raw:"),
       "field 'hardware.profiled.refine_by_size.decode[0].upto': a size class ends at a power of two"},
      {"order", replaced("  raw:", "  refine_by_size: {prefill: [{upto: 4, factor: 1, steps: 30}, {upto: 2, factor: 1, "
                                   "steps: 30}]}\n  raw:"),
       "field 'hardware.profiled.refine_by_size.prefill[1].upto': the size classes go in ascending order"},
      {"classkind", replaced("  raw:", "  refine_by_size: {multi: []}\n  raw:"),
       "field 'hardware.profiled.refine_by_size.multi': unknown field"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const std::string path = write_file(c.name + ".yaml", c.text);
    const std::string err = load_error(workload_with(path));
    CHECK(err.find(path + ":") != std::string::npos);
    CHECK(err.find(c.expect) != std::string::npos);
  }
  const std::string path = write_file("good.yaml", good);
  CHECK(load_error(workload_with(path)).empty());
  CHECK(load_error(workload_with(path, "llama-100m")).find("the profile was measured on model 'tiny'") !=
        std::string::npos);
  CHECK(
      load_error(workload_with(path, "tiny", 2)).find("field 'engine.tp': the hardware profile was measured at tp 1") !=
      std::string::npos);
}

namespace {
struct Recorder : executor_i {
  std::vector<std::pair<int32_t, int32_t>> steps;  // (sequences, tokens)
  StepResult execute(const StepPlan& p) override {
    CHECK(int32_t(p.tokens.size()) == p.num_tokens);
    steps.push_back({int32_t(p.seqs.size()), p.num_tokens});
    StepResult r;
    r.elapsed = 1;
    r.sampled.assign(size_t(p.num_samples), 0);
    return r;
  }
  std::string name() const override { return "recorder"; }
  bool simulated() const override { return false; }
};
}  // namespace

TEST_CASE("warm-up runs a prefill and a decode step at every graph bucket up to max_num_seqs") {
  Recorder r;
  CHECK(warm_up(r, {100, 16, 512, 48, 2048}) == 8);
  const std::vector<std::pair<int32_t, int32_t>> want = {{1, 256}, {1, 1},   {2, 2},   {4, 4},
                                                         {8, 8},   {16, 16}, {32, 32}, {48, 48}};
  CHECK(r.steps == want);
}
