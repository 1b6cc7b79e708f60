// GPU benchmarks of the CUDA backend (exit 77 without a GPU), on a Llama-3-8B-shaped model
// with dummy bf16 weights:
//   - the two ceilings, measured in the same run: device-to-device copy bandwidth (bytes read
//     plus written) and the bf16 GEMM rate (cuBLASLt's own choice at 8192^3);
//   - decode step time at batch 1..256 over a 1k context, prefill at 512, 2k and 8k tokens,
//     each against its roofline, in deterministic mode (the numerics contract; GEMM algorithms
//     pinned at 256 and at 64 tokens; attention on CUDA cores and on tensor cores) and fast mode.
// Times are wall-clock per step as the engine sees them (metadata copy, kernels or graph
// replay, sampled tokens back), medians of repeated steps.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cuda/buffer.h"
#include "backend/cuda/check.h"
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/device.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "core/rng.h"

using namespace tandem;
using json = nlohmann::json;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median milliseconds of `reps` runs of f on `stream`, timed with events, after warm-up.
template <class F>
double time_events(cudaStream_t s, int warmup, int reps, F&& f) {
  cudaEvent_t a, b;
  TANDEM_CUDA_CHECK(cudaEventCreate(&a));
  TANDEM_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) f(i);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    TANDEM_CUDA_CHECK(cudaEventRecord(a, s));
    f(i);
    TANDEM_CUDA_CHECK(cudaEventRecord(b, s));
    TANDEM_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    TANDEM_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  return median(ms);
}

struct Ceilings {
  double copy_bytes_per_s = 0, gemm_flops_per_s = 0, gemm_pinned_flops_per_s = 0;
};

Ceilings measure_ceilings(cudaStream_t s) {
  Ceilings c;
  {
    const size_t n = size_t(1) << 30;  // 1 Gi bf16 = 2 GiB each way, far past the L2
    cuda::DeviceBuffer<cuda::bf16> src(n), dst(n);
    cuda::fill_uniform(src.get(), 1, int64_t(n), int64_t(n), 0, 0, 1, 1, 1.0f, s);
    const double ms = time_events(s, 3, 10, [&](int) {
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), n * 2, cudaMemcpyDeviceToDevice, s));
    });
    c.copy_bytes_per_s = 2.0 * double(n) * 2.0 / (ms * 1e-3);
  }
  {
    const int64_t M = 8192;
    cuda::DeviceBuffer<cuda::bf16> x(size_t(M * M)), y(size_t(M * M));
    std::vector<cuda::DeviceBuffer<cuda::bf16>> w;  // three weights in rotation: no cache reuse between runs
    for (int i = 0; i < 3; ++i) {
      w.emplace_back(size_t(M * M));
      cuda::fill_uniform(w.back().get(), M, M, M, 0, 0, 2, uint64_t(i), 0.05f, s);
    }
    cuda::fill_uniform(x.get(), M, M, M, 0, 0, 3, 0, 1.0f, s);
    for (const bool pinned : {false, true}) {
      cuda::Gemm g(pinned, 256);
      const double ms =
          time_events(s, 3, 10, [&](int i) { g.run_bf16_out(x.get(), M, M, w[size_t(i % 3)].get(), M, y.get(), s); });
      (pinned ? c.gemm_pinned_flops_per_s : c.gemm_flops_per_s) = 2.0 * double(M) * M * M / (ms * 1e-3);
    }
  }
  return c;
}

struct StepTimer {
  cuda::CudaModel& model;
  int32_t num_blocks, block_size;
  Rng rng{7};

  // Median wall-clock ms of a step with `seqs` sequences of n tokens after `context` cached ones.
  double time(int32_t seqs, int32_t n, int32_t context, int warmup, int reps) {
    const ModelSpec& m = model.spec();
    const int32_t blocks_per_seq = (context + n + block_size - 1) / block_size;
    if (int64_t(seqs) * blocks_per_seq > num_blocks)
      throw std::logic_error(fmt::format("bench: {} x {} blocks do not fit in {}", seqs, blocks_per_seq, num_blocks));
    std::vector<std::vector<int32_t>> tables(static_cast<size_t>(seqs));
    StepPlan plan;
    for (int32_t s = 0; s < seqs; ++s) {
      for (int32_t b = 0; b < blocks_per_seq; ++b) tables[size_t(s)].push_back(s * blocks_per_seq + b);
      plan.add({s, n, context, true, tables[size_t(s)]}, implied_prompt_len(context, n));
      for (int32_t i = 0; i < n; ++i) plan.tokens.push_back(Token(rng.uniform_int(0, m.vocab - 1)));
    }
    std::vector<double> ms;
    std::vector<Token> sampled;
    for (int i = 0; i < warmup + reps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      model.forward(plan, plan.tokens, sampled);
      const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (i >= warmup) ms.push_back(t);
      sampled.clear();
    }
    return median(ms);
  }
};

// One decoder layer of `m` op by op at `batch` decode tokens over `context` cached keys, each op
// timed alone with CUDA events (median of 20 after 3 warm-up runs): where a decode step's time
// goes, without a profiler. Every attention variant and both GEMM choices (pinned cuBLASLt, the
// own tensor-core GEMM) are timed; the step itself runs one of each.
json layer_ops(const ModelSpec& m, int32_t batch, int32_t context, int32_t pin_tokens, cudaStream_t s) {
  const int64_t h = m.hidden, hd = m.head_dim(), H = m.heads, KV = m.kv_heads, F = m.ffn, T = batch;
  const int64_t qkv_n = (H + 2 * KV) * hd;
  const int32_t bs = 16, blocks_per_seq = (context + 1 + bs - 1) / bs, num_blocks = batch * blocks_per_seq;
  const auto filled = [&](int64_t rows, int64_t cols, uint64_t id, float scale) {
    cuda::DeviceBuffer<cuda::bf16> b(size_t(rows * cols));
    cuda::fill_uniform(b.get(), rows, cols, cols, 0, 0, 11, id, scale, s);
    return b;
  };
  const auto wqkv = filled(qkv_n, h, 1, 0.02f), wo = filled(h, H * hd, 2, 0.02f), wgu = filled(2 * F, h, 3, 0.02f),
             wd = filled(h, F, 4, 0.02f), xn = filled(T, h, 5, 1.0f), act = filled(T, F, 6, 1.0f),
             attn_in = filled(T, H * hd, 7, 1.0f);
  const size_t kv_elems = size_t(num_blocks) * bs * size_t(KV * hd);
  const auto k_cache = filled(1, int64_t(kv_elems), 8, 1.0f), v_cache = filled(1, int64_t(kv_elems), 9, 1.0f);
  cuda::DeviceBuffer<float> x(size_t(T * h)), partial(size_t(T * h)), qkv(size_t(T * qkv_n)), gu(size_t(T * 2 * F)),
      norm_w(static_cast<size_t>(h)), rope_cos(size_t((context + 1) * hd / 2)), rope_sin(rope_cos.size());
  for (auto* b : {&x, &partial, &qkv, &gu, &norm_w, &rope_cos, &rope_sin})
    TANDEM_CUDA_CHECK(cudaMemsetAsync(b->get(), 0, b->size() * sizeof(float), s));
  cuda::DeviceBuffer<cuda::bf16> xn_out(size_t(T * h)), attn_out(size_t(T * H * hd)), act_out(size_t(T * F));
  std::vector<int32_t> positions(static_cast<size_t>(T), context), slots(static_cast<size_t>(T)),
      tables(static_cast<size_t>(num_blocks));
  std::vector<cuda::AttentionTile> tiles;
  for (int32_t b = 0; b < batch; ++b) {
    for (int32_t i = 0; i < blocks_per_seq; ++i) tables[size_t(b * blocks_per_seq + i)] = b * blocks_per_seq + i;
    slots[size_t(b)] = (b * blocks_per_seq + context / bs) * bs + context % bs;
    tiles.push_back({b, b, 1, context});
  }
  const auto up = [&](const auto& v) {
    cuda::DeviceBuffer<std::decay_t<decltype(v[0])>> d(v.size());
    TANDEM_CUDA_CHECK(cudaMemcpy(d.get(), v.data(), v.size() * sizeof(v[0]), cudaMemcpyHostToDevice));
    return d;
  };
  const auto d_pos = up(positions), d_slots = up(slots), d_tables = up(tables);
  const auto d_tiles = up(tiles);
  const int32_t max_positions = blocks_per_seq * bs;
  cuda::DeviceBuffer<float> ws(size_t(cuda::attention_split_workspace_floats(T * H, max_positions, int32_t(hd))));
  cuda::AttentionArgs a{.qkv = qkv.get(),
                        .qkv_stride = qkv_n,
                        .k_cache = k_cache.get(),
                        .v_cache = v_cache.get(),
                        .block_tables = d_tables.get(),
                        .table_width = blocks_per_seq,
                        .block_size = bs,
                        .tiles = d_tiles.get(),
                        .n_tiles = batch,
                        .heads = int32_t(H),
                        .kv_heads = int32_t(KV),
                        .head_dim = int32_t(hd),
                        .out = attn_out.get(),
                        .tokens = T,
                        .max_positions = max_positions,
                        .split_workspace = ws.get(),
                        .split_workspace_floats = int64_t(ws.size())};
  cuda::Gemm pinned(true, pin_tokens, 8192), own(true, pin_tokens, 8192, true);
  json ops = json::array();
  const auto op = [&](const char* name, double bytes, auto&& f) {
    const double us = 1e3 * time_events(s, 3, 20, [&](int) { f(); });
    const double roof_us = bytes / 4.0e12 * 1e6;  // nominal 4 TB/s, for scale only (the measured copy rate is above)
    std::printf("  %-26s %10.1f us  %10.2f MB  %8.1f us at 4 TB/s\n", name, us, bytes / 1e6, roof_us);
    ops.push_back({{"op", name}, {"us", us}, {"bytes", bytes}});
  };
  std::printf("\nlayer ops, batch %d, context %d (llama3-8b shapes, one layer; GEMMs pinned at %d)\n", batch, context,
              pin_tokens);
  const double wbytes = 2.0;
  op("add_rmsnorm", 12.0 * T * h,
     [&] { cuda::add_rmsnorm(x.get(), partial.get(), norm_w.get(), T, h, 1e-5f, xn_out.get(), s); });
  op("add_rmsnorm v2", 12.0 * T * h, [&] {
    cuda::add_rmsnorm(x.get(), partial.get(), norm_w.get(), T, h, 1e-5f, xn_out.get(), s, cuda::RowKernels::V2);
  });
  op("gemm qkv (pinned)", wbytes * qkv_n * h, [&] { pinned.run(xn.get(), T, h, wqkv.get(), qkv_n, qkv.get(), s); });
  op("gemm qkv (own)", wbytes * qkv_n * h, [&] { own.run(xn.get(), T, h, wqkv.get(), qkv_n, qkv.get(), s); });
  op("rope_store_kv", 8.0 * T * qkv_n, [&] {
    cuda::rope_store_kv(qkv.get(), d_pos.get(), d_slots.get(), rope_cos.get(), rope_sin.get(), T, int32_t(H),
                        int32_t(KV), int32_t(hd), k_cache.get(), v_cache.get(), s);
  });
  op("rope_store_kv v2", 8.0 * T * qkv_n, [&] {
    cuda::rope_store_kv(qkv.get(), d_pos.get(), d_slots.get(), rope_cos.get(), rope_sin.get(), T, int32_t(H),
                        int32_t(KV), int32_t(hd), k_cache.get(), v_cache.get(), s, cuda::RowKernels::V2);
  });
  const double kv_read = 2.0 * 2.0 * double(T) * (context + 1) * KV * hd;
  op("attention simt", kv_read, [&] { cuda::paged_attention(a, s); });
  op("attention split", kv_read, [&] { cuda::paged_attention_split(a, s); });
  cuda::AttentionArgs inblock = a;
  inblock.split_workspace = nullptr;
  op("attention split in-block", kv_read, [&] { cuda::paged_attention_split(inblock, s); });
  op("attention mma_split", kv_read, [&] { cuda::paged_attention_mma_split(a, s); });
  op("attention mma_split in-block", kv_read, [&] { cuda::paged_attention_mma_split(inblock, s); });
  if (m.heads / m.kv_heads <= 64) {
    // The mma kernel takes its own tiles (up to 64 rows); one token per tile is a valid layout.
    op("attention mma", kv_read, [&] { cuda::paged_attention_mma(a, s); });
  }
  op("gemm o (pinned)", wbytes * h * H * hd,
     [&] { pinned.run(attn_in.get(), T, H * hd, wo.get(), h, partial.get(), s); });
  op("gemm o (own)", wbytes * h * H * hd, [&] { own.run(attn_in.get(), T, H * hd, wo.get(), h, partial.get(), s); });
  op("gemm gate/up (pinned)", wbytes * 2 * F * h, [&] { pinned.run(xn.get(), T, h, wgu.get(), 2 * F, gu.get(), s); });
  op("gemm gate/up (own)", wbytes * 2 * F * h, [&] { own.run(xn.get(), T, h, wgu.get(), 2 * F, gu.get(), s); });
  op("swiglu", 10.0 * T * F, [&] { cuda::swiglu(gu.get(), T, F, act_out.get(), s); });
  op("gemm down (pinned)", wbytes * h * F, [&] { pinned.run(act.get(), T, F, wd.get(), h, partial.get(), s); });
  op("gemm down (own)", wbytes * h * F, [&] { own.run(act.get(), T, F, wd.get(), h, partial.get(), s); });
  return {{"batch", batch}, {"context", context}, {"ops", ops}};
}
}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  bool quick = false, ops_only = false;  // --ops: the per-op table of one layer only (no ceilings, no modes)
  std::vector<std::string> only_modes;   // empty: all (one process per mode keeps a crash from losing the rest)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else if (a == "--quick")
      quick = true;
    else if (a == "--mode" && i + 1 < argc)
      only_modes.push_back(argv[++i]);
    else if (a == "--ops")
      ops_only = true;
    else {
      std::fprintf(stderr,
                   "usage: bench_cuda [--json PATH] [--quick] [--ops] [--mode deterministic|deterministic_mma|"
                   "deterministic_split|deterministic_mma_split|deterministic_split_v2|deterministic_own_split_v2|"
                   "deterministic_pin64|fast "
                   "...]\n");
      return 2;
    }
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach the log even if a time limit stops the run
  if (cuda::device_count() == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  try {
    TANDEM_CUDA_CHECK(cudaSetDevice(0));
    cudaStream_t s;
    TANDEM_CUDA_CHECK(cudaStreamCreate(&s));
    if (ops_only) {
      json out;
      out["device"] = cuda::device_description(0);
      const ModelSpec m = *model_preset("llama3-8b");
      for (const int32_t b : {1, 64}) out["layer_ops"].push_back(layer_ops(m, b, 1024, 256, s));
      if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
      return 0;
    }
    const Ceilings c = measure_ceilings(s);
    json out;
    out["device"] = cuda::device_description(0);
    out["copy_tb_per_s"] = c.copy_bytes_per_s / 1e12;
    out["gemm_bf16_tflops"] = c.gemm_flops_per_s / 1e12;
    out["gemm_bf16_pinned_tflops"] = c.gemm_pinned_flops_per_s / 1e12;
    if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
    std::printf(
        "%s\ncopy %.2f TB/s (read + write), bf16 GEMM 8192^3 %.0f TFLOP/s (cuBLASLt heuristic), %.0f TFLOP/s "
        "(pinned, no split-K)\n",
        out["device"].get<std::string>().c_str(), c.copy_bytes_per_s / 1e12, c.gemm_flops_per_s / 1e12,
        c.gemm_pinned_flops_per_s / 1e12);

    ModelSpec m = *model_preset("llama3-8b");
    if (quick) m.layers = 4;
    const int32_t context = 1024, bs = 16;
    const std::vector<int32_t> batches =
        quick ? std::vector<int32_t>{1, 64} : std::vector<int32_t>{1, 8, 32, 64, 128, 256};
    const std::vector<int32_t> prefills = quick ? std::vector<int32_t>{512} : std::vector<int32_t>{512, 2048, 8192};
    const int32_t max_batch = batches.back();
    const double linear = m.linear_params(), head = double(m.hidden) * m.vocab;
    const double kv_token = m.kv_bytes_per_token(2);                             // bf16 K and V, all layers
    const double attn_flops_per_pair = 4.0 * m.head_dim() * m.heads * m.layers;  // QK and PV, per (query, key)
    // Deterministic mode pins one GEMM algorithm per shape, chosen for a step of pin_tokens
    // tokens: a small pin favours decode (more thread blocks per skinny GEMM), a large one
    // prefill. Both are measured, and fast mode (no pinning) beside them.
    // The attention kernel is the other choice: CUDA cores (simt) or tensor cores (mma).
    // The kernels of the CUDA speed issue (#23) come in behind switches: split-KV attention,
    // RMSNorm/RoPE v2 and the own GEMM (skinny up to 64 rows); each mode adds one.
    struct Mode {
      const char* name;
      bool deterministic;
      int32_t pin_tokens;
      cuda::AttentionKernel attention;
      cuda::RowKernels rows = cuda::RowKernels::V1;
      bool own_gemm = false;
    };
    const auto simt = cuda::AttentionKernel::Simt, mma = cuda::AttentionKernel::Mma,
               split = cuda::AttentionKernel::Split;
    for (const Mode& md : {Mode{"deterministic", true, 256, simt}, Mode{"deterministic_mma", true, 256, mma},
                           Mode{"deterministic_split", true, 256, split},
                           Mode{"deterministic_mma_split", true, 256, cuda::AttentionKernel::MmaSplit},
                           Mode{"deterministic_split_v2", true, 256, split, cuda::RowKernels::V2},
                           Mode{"deterministic_own_split_v2", true, 256, split, cuda::RowKernels::V2, true},
                           Mode{"deterministic_pin64", true, 64, simt}, Mode{"fast", false, 256, simt}}) {
      if (!only_modes.empty() && std::find(only_modes.begin(), only_modes.end(), md.name) == only_modes.end()) continue;
      const char* mode = md.name;
      const bool deterministic = md.deterministic;
      cuda::CudaModelOptions o;
      o.attention = md.attention;
      o.row_kernels = md.rows;
      o.gemm_own_kernel = md.own_gemm;
      o.deterministic = deterministic;
      o.gemm_pin_tokens = md.pin_tokens;
      o.max_step_tokens = prefills.back();
      o.max_step_seqs = max_batch;
      const int32_t blocks = std::max(max_batch * ((context + 1 + bs - 1) / bs), (prefills.back() + bs - 1) / bs);
      cuda::CudaModel model(m, nullptr, 1, blocks, bs, o);
      model.randomize_kv_cache(5);
      if (md.pin_tokens != 256 || md.attention != simt)
        std::printf("\n");
      else
        std::printf("%s", model.describe().c_str());
      out[mode]["pin_tokens"] = deterministic ? md.pin_tokens : 0;
      StepTimer timer{model, blocks, bs};
      std::printf("\n[%s] decode, context %d             ms   roofline ms   %% of roofline\n", mode, context);
      for (const int32_t b : batches) {
        const double ms = timer.time(b, 1, context, 3, 20);
        const double bytes = (linear + head) * 2.0 + b * double(context + 1) * kv_token;
        const double flops = 2.0 * (linear + head) * b + attn_flops_per_pair * b * (context + 1);
        const double roof = std::max(bytes / c.copy_bytes_per_s, flops / c.gemm_flops_per_s) * 1e3;
        std::printf("  batch %-4d %22.3f %13.3f %14.1f\n", b, ms, roof, 100.0 * roof / ms);
        out[mode]["decode"].push_back({{"batch", b},
                                       {"context", context},
                                       {"ms", ms},
                                       {"roofline_ms", roof},
                                       {"bytes", bytes},
                                       {"flops", flops}});
      }
      // Written after each part too: a mode stopped by its time limit in prefill (the own GEMM's
      // 8k prefill is slow) keeps its decode figures.
      if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
      std::printf("[%s] prefill                      ms   TFLOP/s   %% of GEMM rate\n", mode);
      for (const int32_t t : prefills) {
        const double ms = timer.time(1, t, 0, 1, 3);
        const double flops = 2.0 * linear * t + 2.0 * head + attn_flops_per_pair * double(t) * (t + 1) / 2.0;
        const double rate = flops / (ms * 1e-3);
        std::printf("  %5d tokens %20.3f %9.0f %14.1f\n", t, ms, rate / 1e12, 100.0 * rate / c.gemm_flops_per_s);
        out[mode]["prefill"].push_back({{"tokens", t}, {"ms", ms}, {"flops", flops}, {"tflops", rate / 1e12}});
        if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
      }
      const cuda::CudaModelStats st = model.stats();
      out[mode]["graph_replays"] = st.graph_replays;
      if (!json_path.empty())
        std::ofstream(json_path) << out.dump(2) << "\n";  // after each mode: a timeout keeps the rest
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    return 1;
  }
}
