// CPU backend benchmarks, all measured in this run: the machine's fp32 GEMM rate (Eigen)
// and copy bandwidth, then the 100M-class preset's prefill GFLOP/s and decode tokens/s
// against them, and the cost of the numerics contract (invariant vs Eigen GEMM path).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "backend/cost_model.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/llama.h"
#include "core/rng.h"
#include "sim/base/host_probe.h"

using namespace tandem;
using namespace tandem::cpu;
using Clock = std::chrono::steady_clock;

namespace {
template <class F>
double median_s(F&& f, int reps) {
  std::vector<double> t;
  f();  // warm up
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<float> randv(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(r.uniform(-1, 1));
  return v;
}

struct StepBench {
  double seconds, flops, bytes;
};

// One step of `seqs` sequences, each with `ctx` cached tokens and `n` new ones.
StepBench run_step(LlamaModel& model, int seqs, int n, int ctx, int reps) {
  const ModelSpec& m = model.spec();
  StepPlan plan;
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(seqs));
  int32_t next = 0;
  Rng rng(9);
  for (int s = 0; s < seqs; ++s) {
    for (int b = 0; b < (ctx + n + 15) / 16; ++b) tables[size_t(s)].push_back(next++);
    plan.add({s, n, ctx, true, tables[size_t(s)]}, implied_prompt_len(ctx, n));
    for (int i = 0; i < n; ++i) plan.tokens.push_back(Token(rng.uniform_int(0, m.vocab - 1)));
  }
  std::vector<Token> out;
  const double s = median_s(
      [&] {
        out.clear();
        model.forward(plan, plan.tokens, out);
      },
      reps);
  const PlanFeatures f = plan_features(plan);
  const double flops = 2.0 * m.linear_params() * f.tokens + 2.0 * m.hidden * double(m.vocab) * f.samples +
                       4.0 * m.layers * m.heads * m.head_dim() * f.attn_pairs;
  const double bytes = 4.0 * (m.linear_params() + double(m.hidden) * m.vocab) +
                       m.kv_bytes_per_token(4) * f.context_tokens;  // fp32 K and V
  return {s, flops, bytes};
}
}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const int reps = quick ? 2 : 5;
  fmt::print("CPU backend benchmark, {} threads (medians of {} runs)\n\n", threads(), reps);
  // Every figure below is this machine's only while other work leaves its cores alone.
  const ConditionsProbe probe(threads());

  // Ceilings, measured now.
  const int64_t G = 1536;
  auto A = randv(size_t(G * G), 1), B = randv(size_t(G * G), 2), C = std::vector<float>(size_t(G * G));
  const double gemm_flops = 2.0 * double(G) * G * G;
  const double t_eigen = median_s([&] { gemm_nt_eigen(A.data(), G, G, B.data(), G, C.data()); }, reps);
  const double t_inv = median_s([&] { gemm_nt(A.data(), G, G, B.data(), G, C.data()); }, reps);
  const double peak = gemm_flops / t_eigen;
  std::vector<float> src(size_t(64) << 20, 1.0f), dst(src.size());
  const double t_copy = median_s([&] { std::memcpy(dst.data(), src.data(), src.size() * 4); }, reps);
  const double copy_bw = 2.0 * double(src.size()) * 4 / t_copy;  // bytes read + written
  // Decode streams weights: the bound uses read bandwidth (all threads summing the array).
  // Decode streams the weights once per step: the bound is the rate at which all threads
  // read a buffer of the model's weight size with the kernels' own 8-lane loads. (This
  // machine's 260 MB L3 holds part of it, as it holds part of the weights.)
  ModelSpec m = *model_preset("llama-100m");
  const size_t wfloats = size_t(m.linear_params() + double(m.hidden) * m.vocab);
  std::vector<float> wbuf = randv(wfloats, 4);
  double sink = 0;
  const double t_read = median_s(
      [&] {
        const int nt = threads();
        double acc = 0;
#pragma omp parallel for reduction(+ : acc) num_threads(nt)
        for (int i = 0; i < nt; ++i) {
          const size_t b = wfloats * size_t(i) / size_t(nt), e = wfloats * size_t(i + 1) / size_t(nt);
          acc += dot(wbuf.data() + b, wbuf.data() + b, int64_t(e - b));
        }
        sink += acc;
      },
      reps);
  const double bw = double(wfloats) * 4 / t_read;
  fmt::print("{:<44}{:>12}\n", "ceiling", "value");
  fmt::print("{:<44}{:>9.1f} GFLOP/s\n", "fp32 GEMM 1536^3, Eigen (the peak)", peak / 1e9);
  fmt::print("{:<44}{:>9.1f} GFLOP/s  ({:.0f}% of Eigen)\n", "fp32 GEMM 1536^3, batch-invariant gemm_nt",
             gemm_flops / t_inv / 1e9, 100 * t_eigen / t_inv);
  fmt::print("{:<44}{:>9.1f} GB/s\n", "memcpy 256 MB (read + write)", copy_bw / 1e9);
  fmt::print("{:<44}{:>9.1f} GB/s  ({:.0f} MB; checksum {:.3g})\n\n", "read the weights' size, all threads", bw / 1e9,
             double(wfloats) * 4 / 1e6, sink);

  fmt::print("model {}: {:.1f} M parameters, fp32\n", m.name, m.params() / 1e6);
  LlamaModel model(m, dummy_weights(m, 3), 4096, 16);
  fmt::print("{:<26}{:>10}{:>12}{:>16}{:>12}\n", "prefill", "ms", "GFLOP/s", "% of GEMM peak", "tokens/s");
  for (int n : {512, 2048}) {
    const StepBench b = run_step(model, 1, n, 0, quick ? 1 : 3);
    fmt::print("{:<26}{:>10.1f}{:>12.1f}{:>15.0f}%{:>12.0f}\n", fmt::format("{} tokens", n), b.seconds * 1e3,
               b.flops / b.seconds / 1e9, 100 * b.flops / b.seconds / peak, n / b.seconds);
  }
  fmt::print("\n{:<26}{:>10}{:>12}{:>16}{:>14}\n", "decode (context 512)", "ms", "tokens/s", "bound tokens/s",
             "% of bound");
  for (int batch : {1, 8, 32}) {
    const StepBench b = run_step(model, batch, 1, 512, reps);
    const double bound = batch / std::max(b.bytes / bw, b.flops / peak);
    fmt::print("{:<26}{:>10.2f}{:>12.0f}{:>16.0f}{:>13.0f}%\n", fmt::format("batch {}", batch), b.seconds * 1e3,
               batch / b.seconds, bound, 100 * (batch / b.seconds) / bound);
  }
  fmt::print("\ncost of the numerics contract (same steps, Eigen GEMM path instead of gemm_nt)\n");
  fmt::print("{:<26}{:>14}{:>14}{:>10}\n", "step", "invariant ms", "eigen ms", "ratio");
  for (auto [seqs, n, ctx] :
       {std::tuple{1, 512, 0}, std::tuple{1, 2048, 0}, std::tuple{8, 1, 512}, std::tuple{32, 1, 512}}) {
    model.set_gemm_path(GemmPath::Invariant);
    const double a = run_step(model, seqs, n, ctx, quick ? 1 : 3).seconds;
    model.set_gemm_path(GemmPath::Eigen);
    const double e = run_step(model, seqs, n, ctx, quick ? 1 : 3).seconds;
    fmt::print("{:<26}{:>14.2f}{:>14.2f}{:>9.2f}x\n", fmt::format("{} x {} tok, ctx {}", seqs, n, ctx), a * 1e3,
               e * 1e3, a / e);
  }
  // What TP-invariance costs: the row-split GEMMs (o and down) reduce over segments summed as a
  // tree (gemm_nt_segmented) instead of one run over K. Both on the same data, interleaved.
  const int32_t segs = m.reduction_segments();
  fmt::print("\ncost of TP-invariance: the row-split GEMMs in {} segments vs one run over K\n", segs);
  fmt::print("{:<34}{:>14}{:>14}{:>10}\n", "GEMM (T x K -> N)", "one run ms", "segmented ms", "ratio");
  for (auto [T, K] : {std::pair<int64_t, int64_t>{1, m.heads * m.head_dim()}, {32, m.heads * m.head_dim()},
                      {512, m.heads * m.head_dim()}, {1, m.ffn}, {32, m.ffn}, {512, m.ffn}}) {
    const int64_t N = m.hidden;
    auto X = randv(size_t(T * K), 5), W = randv(size_t(N * K), 6), Y = std::vector<float>(size_t(T * N));
    std::vector<double> one, seg;
    for (int r = 0; r < 3; ++r) {  // interleaved rounds: the machine's load falls on both alike
      one.push_back(median_s([&] { gemm_nt(X.data(), T, K, W.data(), N, Y.data()); }, reps));
      seg.push_back(median_s([&] { gemm_nt_segmented(X.data(), T, K, W.data(), N, Y.data(), segs); }, reps));
    }
    std::sort(one.begin(), one.end());
    std::sort(seg.begin(), seg.end());
    fmt::print("{:<34}{:>14.3f}{:>14.3f}{:>9.2f}x\n", fmt::format("{} x {} -> {}", T, K, N), one[1] * 1e3,
               seg[1] * 1e3, seg[1] / one[1]);
  }
  // Tensor parallelism on the same cores: TP=2 (two ranks, one thread each) against TP=1
  // (kernels on both threads).
  model.set_gemm_path(GemmPath::Invariant);
  LlamaModel tp2(m, dummy_weights(m, 3), 4096, 16, 2);
  fmt::print("\ntensor parallelism, {} threads: TP=2 (one thread per rank) vs TP=1\n", threads());
  fmt::print("{:<26}{:>14}{:>14}{:>10}\n", "step", "TP=1 ms", "TP=2 ms", "TP2/TP1");
  for (auto [seqs, n, ctx] : {std::tuple{1, 512, 0}, std::tuple{8, 1, 512}, std::tuple{32, 1, 512}}) {
    const double a = run_step(model, seqs, n, ctx, quick ? 1 : 3).seconds;
    const double b = run_step(tp2, seqs, n, ctx, quick ? 1 : 3).seconds;
    fmt::print("{:<26}{:>14.2f}{:>14.2f}{:>9.2f}x\n", fmt::format("{} x {} tok, ctx {}", seqs, n, ctx), a * 1e3,
               b * 1e3, b / a);
  }
  const MeasureConditions cond = probe.finish();
  fmt::print("\nmeasured under: {}\n", conditions_text(cond));
  if (const std::string warning = conditions_warning(cond, "this benchmark"); !warning.empty()) {
    fmt::print("WARNING: {}\n", warning);
    fmt::print(stderr, "bench_cpu: warning: {}\n", warning);
  }
  return 0;
}
