// A profiled cost model's data (tandem calibrate --model): the synthetic steps measured on a
// backend, kept raw in the profile file, and the per-operator-class curves derived from them.
// Design and why step totals rather than per-kernel timers: reports/simulation-fidelity/report.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

// Piecewise-linear over increasing knots x, extrapolated linearly past both ends (a GEMM is
// linear in its rows once compute-bound), never below zero. One knot: constant.
struct Curve {
  std::vector<double> x, y;
  double at(double v) const;
  bool empty() const { return x.empty(); }
};

// One measured synthetic step. Shapes (kind):
//   prefill: one sequence, `tokens` new tokens over `context` cached ones, not sampled;
//   multi:   `seqs` sequences of `tokens` new tokens each, no context, sampled or not;
//   decode:  `seqs` sequences of one token each over `context` cached ones, all sampled;
//   mixed:   one prompt of `tokens` tokens (sampled) joining `seqs` decodes over `context`
//            (a check of the composition; with mixed_fit, the measure of its correction);
//   allreduce: a step's tensor-parallel all-reduces alone (tp > 1: two per layer, after attention
//            and after the MLP, of `tokens` x hidden activations), timed on the communicator.
// idle: measured after the backend sat idle for 20 ms (the others run back to back).
struct ProfileStep {
  std::string kind;
  int32_t seqs = 1, tokens = 1, context = 0;
  bool sampled = false, idle = false;
  double seconds = 0;  // the fastest of the repetitions
};

// Where and under what contention a profile was measured (tandem calibrate records it; a profile
// without it reads as unknown). On a shared machine other work slows some repetitions of a
// shape; these figures say how much, so a profile measured under contention can be refused or
// read with that in mind (reports/simulation-fidelity/report.md, second round).
struct CalibrationConditions {
  double load_before = -1, load_after = -1;  // 1-minute load average before the grid and at the end (-1: unknown)
  double others_grid = -1, steal_grid = -1;  // share of the machine's CPU time other processes used / was stolen, grid
  double others_serving = -1;                // the same during the served calibration traffic
  double cpu_share_grid = -1;  // CPU backend: the grid's CPU time over (wall time x threads); below 1, it waited for a core
  std::string reference;                     // the reference shape, timed (median of 5) before and after the grid
  double reference_before_ms = 0, reference_after_ms = 0;
  // Agreement of repetitions: per shape, its second-fastest repetition over its fastest, minus 1.
  double repeat_median = -1;      // median over the compared shapes (-1: one repetition, nothing compared)
  int32_t repeat_over = 0;        // shapes whose two fastest differ by more than kRepeatBound (reported)
  int32_t repeat_compared = 0;    // shapes compared (at least two repetitions and kRepeatMinMs)
  std::string repeat_worst;       // the worst shape, e.g. "decode 16x1 @512: +34.0 %"
  int32_t grid_tries = 1;         // grids measured: calibrate measures again (up to kGridTries) one it would refuse
  bool accepted_noisy = false;    // written with --accept-noisy although the checks refused it
};
// The bounds, from grids measured on a shared 2-core VM (reports/simulation-fidelity/report.md,
// "Contention"): quiet, the repetitions' median disagreement was 3-12 %, the reference moved by
// up to 25 % and the grid had its core 99 % of the time; with two busy loops beside it, the grid
// had its core 72 % of the time while the repetitions agreed as well as when quiet (contention
// that lasts a whole round slows every repetition alike), so the CPU share is the check that
// catches it; the other two catch a grid whose noise is beyond what this machine shows quiet.
constexpr double kRepeatBound = 0.10;       // a shape whose two fastest repetitions differ by more is counted
constexpr double kRepeatMedianMax = 0.20;   // refused: the median shape's two fastest differ by more
// Refused: more than this share of the shapes beyond kRepeatBound. A quiet grid has 0-4 of 69
// (2026-12-06); one with 29 of 69 (median +7.2 %, under the median bound) priced prefill ~10 %
// off the quiet grids half an hour either side of it (reports/simulation-fidelity/report.md).
constexpr double kRepeatOverShareMax = 0.25;
constexpr int kRepeatOverMinShapes = 8;    // the share is judged over at least this many compared shapes
constexpr int kGridTries = 3;              // a refused grid is measured again, up to this many grids in all
constexpr double kRepeatMinMs = 0.5;        // shorter steps are not compared (timer and wake-up jitter)
constexpr double kReferenceBound = 0.40;    // refused: the reference moved by more between before and after
constexpr double kMinCpuShare = 0.90;       // refused (CPU backend): the grid had its cores less of the time

// A residual for the served steps of one size class of one kind (decode: sequences in the step;
// prefill and mixed: tokens in the step): a step whose size is in (upto / 2, upto] takes `factor`
// instead of its kind's residual, a size without a kept class the nearest class's
// (refine_factor, backend/cost_model.h). Classes are powers of two; only classes with enough
// served steps are kept.
struct SizeResidual {
  int32_t upto = 0;
  double factor = 1.0;
  int32_t steps = 0;
};

struct OperatorProfile {
  // Provenance: what it was measured on, and how.
  std::string backend, model, hardware, code_version, measured_at, engine;
  int32_t threads = 0, tp = 1;
  bool graph_buckets = false;  // decode-only steps run padded to the next power of two of sequences
  // The mixed shapes correct the composition of mixed steps (measured / composed, by the prompt's
  // tokens) instead of only checking it. Profiles written before it keep them as checks.
  bool mixed_fit = false;
  std::vector<ProfileStep> raw;
  // After-idle steps cost idle_factor times more; 1 unless enough samples were measured.
  double idle_factor = 1.0;
  int32_t idle_samples = 0;
  // From served traffic (calibrate --workload): the engine loop's time between back-to-back
  // steps, charged as host overhead, and the residual (median measured / predicted) per step kind.
  double loop_gap_s = 0;
  double refine_decode = 1.0, refine_prefill = 1.0, refine_mixed = 1.0;
  int32_t refine_steps = 0;
  // The residual by size, per step kind (indexed by StepKind: decode, prefill, mixed), ascending
  // in upto: a grid can be right on average and wrong at the sizes served traffic runs most
  // (on the CPU, one-sequence decodes priced 24-27 % high and two-sequence ones 24-26 % low).
  std::vector<SizeResidual> refine_by_size[3];
  CalibrationConditions conditions;

  // Derived by derive_curves() from `raw` (not stored in the file).
  Curve linear;                     // x: tokens in the step; per-token work of every layer (GEMMs, norms, RoPE,
                                    // SwiGLU, all-reduces at tp > 1) plus one sequence's step overhead
  Curve prefill_attn;               // x: query tokens of a chunk; seconds per (query, key) pair
  Curve lm_head;                    // x: sampled rows; LM head and argmax
  Curve seq_overhead;               // x: sequences; per-step cost of sequences beyond the first (metadata)
  std::vector<double> mixed_decodes;  // knots of the mixed correction in decodes (mixed_fit; else empty)
  std::vector<Curve> mixed_factor;    // [i]: measured / composed vs prefill tokens, at mixed_decodes[i] decodes
  Curve allreduce;                  // x: tokens in the step; its all-reduces (tp > 1, measured: empty otherwise).
                                    // Already inside `linear` and the decode table: priced apart, not added
  std::vector<double> decode_seqs;  // knots of the decode table
  std::vector<Curve> decode;        // decode[i]: decode step of decode_seqs[i] sequences vs mean context
};

// Fills the curves from `raw`. Throws std::invalid_argument saying which shapes are missing.
void derive_curves(OperatorProfile& p);
// The mixed correction at a step's prefill tokens and decodes: interpolated in both, held at the
// measured ends (a ratio does not extrapolate); 1 without one.
double mixed_correction(const OperatorProfile& p, double prefill_tokens, double decodes);
// Fills p.mixed_factor from the raw mixed shapes (mixed_fit; cost_model.cpp: it needs the
// composition the cost model prices). Called by derive_curves.
void derive_mixed_factor(OperatorProfile& p);

// The decode table at `seqs` sequences and mean context `context` (interpolated in both).
double decode_seconds(const OperatorProfile& p, double seqs, double context);

}  // namespace tandem
