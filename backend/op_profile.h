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
//            (a check of the composition: not used to derive the curves).
// idle: measured after the backend sat idle for 20 ms (the others run back to back).
struct ProfileStep {
  std::string kind;
  int32_t seqs = 1, tokens = 1, context = 0;
  bool sampled = false, idle = false;
  double seconds = 0;  // the fastest of the repetitions
};

struct OperatorProfile {
  // Provenance: what it was measured on, and how.
  std::string backend, model, hardware, code_version, measured_at, engine;
  int32_t threads = 0, tp = 1;
  bool graph_buckets = false;  // decode-only steps run padded to the next power of two of sequences
  std::vector<ProfileStep> raw;
  // After-idle steps cost idle_factor times more; 1 unless enough samples were measured.
  double idle_factor = 1.0;
  int32_t idle_samples = 0;
  // From served traffic (calibrate --workload): the engine loop's time between back-to-back
  // steps, charged as host overhead, and the residual (median measured / predicted) per step kind.
  double loop_gap_s = 0;
  double refine_decode = 1.0, refine_prefill = 1.0, refine_mixed = 1.0;
  int32_t refine_steps = 0;

  // Derived by derive_curves() from `raw` (not stored in the file).
  Curve linear;                     // x: tokens in the step; per-token work of every layer (GEMMs, norms, RoPE,
                                    // SwiGLU, all-reduces at tp > 1) plus one sequence's step overhead
  Curve prefill_attn;               // x: query tokens of a chunk; seconds per (query, key) pair
  Curve lm_head;                    // x: sampled rows; LM head and argmax
  Curve seq_overhead;               // x: sequences; per-step cost of sequences beyond the first (metadata)
  std::vector<double> decode_seqs;  // knots of the decode table
  std::vector<Curve> decode;        // decode[i]: decode step of decode_seqs[i] sequences vs mean context
};

// Fills the curves from `raw`. Throws std::invalid_argument saying which shapes are missing.
void derive_curves(OperatorProfile& p);

// The decode table at `seqs` sequences and mean context `context` (interpolated in both).
double decode_seconds(const OperatorProfile& p, double seqs, double context);

}  // namespace tandem
