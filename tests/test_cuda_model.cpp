// The CUDA model against its CPU twin, and the numerics contract on the GPU: a token's
// logits bit-identical alone or batched, at once or chunked, computed or shared prefix; TP 1
// through NCCL identical to the plain path; the golden suite with CUDA Graphs on and off.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/comm.h"
#include "backend/cpu/llama.h"
#include "backend/cuda/buffer.h"
#include "backend/cuda/check.h"
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/device.h"
#include "backend/cuda/nccl_communicator.h"
#include "backend/cuda/poison.h"
#include "core/rng.h"
#include "sim/engine/clock.h"
#include "sim/workload/config.h"
#include "sim/engine/engine.h"
#include "sim/workload/workload_gen.h"
#include "tests/model_harness.h"
#include "tests/small_models.h"
#include "tests/test_helpers.h"

using namespace tandem;

namespace {

// Head sizes the kernel takes (64 here; the golden workload's tiny model has 32), a ragged
// ffn, GQA groups of 2 and of 4.
ModelSpec bf16_model(int32_t heads, int32_t kv_heads, int32_t hidden) {
  return testing::small_model({.heads = heads, .kv_heads = kv_heads, .hidden = hidden, .dtype = "bf16"});
}

// The weights both backends use: the CPU model computes in fp32 on the bf16 values.
void round_to_bf16(std::vector<float>& v) {
  for (float& x : v) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;  // round to nearest even (no NaNs here)
    std::memcpy(&x, &u, 4);
  }
}
cpu::LlamaWeights bf16_weights(const ModelSpec& m, uint64_t seed) {
  cpu::LlamaWeights w = cpu::dummy_weights(m, seed);
  round_to_bf16(w.embed);
  round_to_bf16(w.lm_head);
  for (auto& L : w.layers)
    for (auto* t : {&L.wqkv, &L.wo, &L.w_gate_up, &L.w_down}) round_to_bf16(*t);
  return w;
}

using testing::random_tokens;
using testing::Seq;
template <class Model>
using Harness = testing::StepHarness<Model>;

double rel_err(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) { return testing::bit_equal(a, b); }

cuda::CudaModelOptions opts(bool deterministic = true, int32_t tp = 1, bool nccl = false,
                            cuda::AttentionKernel attention = cuda::AttentionKernel::Simt) {
  cuda::CudaModelOptions o;
  o.attention = attention;
  o.deterministic = deterministic;
  o.tp = tp;
  o.nccl_at_tp1 = nccl;
  o.max_step_tokens = 1024;
  o.max_step_seqs = 64;
  return o;
}

constexpr cuda::AttentionKernel kAttentionKernels[] = {cuda::AttentionKernel::Simt, cuda::AttentionKernel::Mma,
                                                       cuda::AttentionKernel::Split, cuda::AttentionKernel::MmaSplit};
std::string name(cuda::AttentionKernel a) {
  switch (a) {
    case cuda::AttentionKernel::Simt: return "simt";
    case cuda::AttentionKernel::Mma: return "mma";
    case cuda::AttentionKernel::Split: return "split";
    case cuda::AttentionKernel::MmaSplit: return "mma_split";
  }
  return "?";
}
bool is_split(cuda::AttentionKernel a) {
  return a == cuda::AttentionKernel::Split || a == cuda::AttentionKernel::MmaSplit;
}

// The same prompt through two configurations of one model (same dummy weights): the
// relative error between the last token's logits.
double logits_rel_err(const ModelSpec& m, const cuda::CudaModelOptions& a, const cuda::CudaModelOptions& b,
                      uint64_t weight_seed, uint64_t prompt_seed, int32_t n) {
  cuda::CudaModel ma(m, nullptr, weight_seed, 128, 16, a), mb(m, nullptr, weight_seed, 128, 16, b);
  Harness<cuda::CudaModel> ha(ma), hb(mb);
  Rng rng(prompt_seed);
  Seq sa{random_tokens(rng, n, m.vocab), {}, 0};
  Seq sb = sa;
  return rel_err(hb.step({{&sb, n}})[0], ha.step({{&sa, n}})[0]);
}

}  // namespace

TEST_CASE("CUDA model vs the CPU twin: logits within bf16 tolerance over a prefill and 12 decode steps") {
  for (const auto kernel : kAttentionKernels)
    for (const ModelSpec& m : {bf16_model(4, 2, 256), bf16_model(4, 1, 512)}) {
      const cpu::LlamaWeights w = bf16_weights(m, 5);
      cpu::LlamaModel ref(m, w, 256, 16);
      cuda::CudaModel gpu(m, &w, 0, 256, 16, opts(true, 1, false, kernel));
      Harness<cpu::LlamaModel> hc(ref);
      Harness<cuda::CudaModel> hg(gpu);
      Rng rng(17);
      Seq sc{random_tokens(rng, 70, m.vocab), {}, 0};
      Seq sg = sc;
      int agree = 0;
      double worst = 0;
      for (int step = 0; step < 13; ++step) {
        const int32_t n = step == 0 ? 70 : 1;
        const auto lc = hc.step({{&sc, n}})[0];
        const auto lg = hg.step({{&sg, n}})[0];
        worst = std::max(worst, rel_err(lg, lc));
        const auto am = [](const std::vector<float>& v) {
          return Token(std::max_element(v.begin(), v.end()) - v.begin());
        };
        agree += am(lc) == am(lg);
        sc.tokens.push_back(am(lc));  // both continue with the CPU's token
        sg.tokens.push_back(am(lc));
      }
      MESSAGE(name(kernel), " attention, head_dim ", m.head_dim(), ", group ", m.heads / m.kv_heads,
              ": worst logits rel err ", worst, ", argmax agrees ", agree, "/13");
      CHECK(worst < 2e-2);
      CHECK(agree >= 11);  // near-ties may flip under bf16 activations
    }
}

TEST_CASE("contract on the GPU: alone == batched, at once == chunked, computed prefix == shared blocks (bit for bit)") {
  for (const auto kernel : kAttentionKernels) {
    CAPTURE(name(kernel));
    const ModelSpec m = bf16_model(4, 1, 512);
    cuda::CudaModel gpu(m, nullptr, 9, 512, 16, opts(true, 1, false, kernel));
    Harness<cuda::CudaModel> h(gpu);
    Rng rng(23);
    const auto prompt = random_tokens(rng, 150, m.vocab);
    Seq alone{prompt, {}, 0};
    const auto ref = h.step({{&alone, 150}})[0];
    // (a) batched with random others, prefills and decodes mixed.
    {
      Seq other{random_tokens(rng, 300, m.vocab), {}, 0}, dec{random_tokens(rng, 40, m.vocab), {}, 0};
      h.step({{&dec, 39}});
      Seq again{prompt, {}, 0};
      const auto out = h.step({{&other, 211}, {&again, 150}, {&dec, 1}});
      CHECK_MESSAGE(same_bits(out[1], ref), "batched with a prefill and a decode");
    }
    // (b) chunks of 1, 7, 16, 100: the last chunk's logits.
    for (const int32_t chunk : {1, 7, 16, 100}) {
      Seq s{prompt, {}, 0};
      std::vector<float> last;
      while (s.computed < 150) last = h.step({{&s, std::min(chunk, 150 - s.computed)}})[0];
      CHECK_MESSAGE(same_bits(last, ref), "chunks of ", chunk);
    }
    // (c) the first 96 tokens' blocks taken from another sequence (as the prefix cache would).
    {
      Seq donor{prompt, {}, 0};
      h.step({{&donor, 96}});
      Seq s{prompt, {donor.table.begin(), donor.table.begin() + 6}, 96};
      CHECK_MESSAGE(same_bits(h.step({{&s, 54}})[0], ref), "shared prefix blocks");
    }
  }
}

TEST_CASE(
    "the own tensor-core GEMM (deterministic fallback) in the model: CPU twin within tolerance, contract bit for bit") {
  const ModelSpec m = bf16_model(4, 1, 512);
  const cpu::LlamaWeights w = bf16_weights(m, 8);
  cuda::CudaModelOptions o = opts();
  o.gemm_own_kernel = true;
  cpu::LlamaModel ref(m, w, 256, 16);
  cuda::CudaModel gpu(m, &w, 0, 256, 16, o);
  Harness<cpu::LlamaModel> hc(ref);
  Harness<cuda::CudaModel> hg(gpu);
  Rng rng(41);
  const auto prompt = random_tokens(rng, 120, m.vocab);
  Seq sc{prompt, {}, 0}, sg{prompt, {}, 0};
  const auto lc = hc.step({{&sc, 120}})[0];
  const auto lg = hg.step({{&sg, 120}})[0];
  const double err = rel_err(lg, lc);
  MESSAGE("own GEMM: logits rel err vs CPU ", err);
  CHECK(err < 2e-2);
  Seq chunked{prompt, {}, 0}, other{random_tokens(rng, 78, m.vocab), {}, 0};  // 77 prefilled, then one decode
  hg.step({{&chunked, 33}, {&other, 77}});
  CHECK(same_bits(hg.step({{&other, 1}, {&chunked, 87}})[1], lg));
}

TEST_CASE("TP 1 through the NCCL communicator == the plain path, bit for bit") {
  const ModelSpec m = bf16_model(4, 2, 256);
  cuda::CudaModel plain(m, nullptr, 3, 128, 16, opts());
  cuda::CudaModel nccl(m, nullptr, 3, 128, 16, opts(true, 1, true));
  Harness<cuda::CudaModel> hp(plain), hn(nccl);
  Rng rng(4);
  Seq a{random_tokens(rng, 90, m.vocab), {}, 0}, b{random_tokens(rng, 40, m.vocab), {}, 0};  // 80 + 2 and 30 + 2 used
  Seq a2 = a, b2 = b;
  for (int step = 0; step < 3; ++step) {
    const auto lp = hp.step({{&a, step ? 1 : 80}, {&b, step ? 1 : 30}});
    const auto ln = hn.step({{&a2, step ? 1 : 80}, {&b2, step ? 1 : 30}});
    CHECK(same_bits(lp[0], ln[0]));
    CHECK(same_bits(lp[1], ln[1]));
  }
}

TEST_CASE("TP 2 on two GPUs matches TP 1 within tolerance (where two GPUs exist)") {
  if (cuda::device_count() < 2) {
    MESSAGE("SKIP TP 2: ", cuda::device_count(), " GPU here; NCCL needs one GPU per rank");
    return;
  }
  const double err = logits_rel_err(bf16_model(4, 2, 256), opts(), opts(true, 2), 3, 8, 64);
  MESSAGE("TP 2 vs TP 1 logits rel err ", err);
  CHECK(err < 2e-2);
}

TEST_CASE("fast mode (cuBLAS heuristics per size) computes the same function, not bit for bit") {
  const double err = logits_rel_err(bf16_model(4, 2, 256), opts(true), opts(false), 6, 12, 200);
  MESSAGE("fast vs deterministic logits rel err ", err);
  CHECK(err < 2e-2);
}

namespace {
// The engine drives the CUDA model like the CLI does; the stats show whether graphs ran.
class ModelExecutor final : public executor_i {
 public:
  explicit ModelExecutor(cuda::CudaModel& m) : m_(m) {}
  StepResult execute(const StepPlan& plan) override {
    StepResult r;
    m_.forward(plan, plan.tokens, r.sampled);
    r.elapsed = 1000;
    return r;
  }
  std::string name() const override { return "cuda-test"; }
  bool simulated() const override { return false; }

 private:
  cuda::CudaModel& m_;
};

const Override kNoChunking{"engine.enable_chunked_prefill", "false"};

// The workload (with overrides) served by a CUDA model built from `o` (its step limits taken
// from the workload); every request must finish. Outputs, and the model's stats and summary.
std::vector<std::vector<Token>> golden_with(const std::vector<Override>& overrides, cuda::CudaModelOptions o,
                                            const std::string& workload = "workloads/golden_small.yaml",
                                            cuda::CudaModelStats* stats = nullptr, Summary* summary = nullptr) {
  Workload w = load_workload(testing::source_path(workload), overrides);
  o.max_step_tokens = w.engine.max_num_batched_tokens;
  o.max_step_seqs = w.engine.max_num_seqs;
  cuda::CudaModel model(w.model, nullptr, w.seed, w.engine.resolved_kv_blocks, w.engine.block_size, o);
  ModelExecutor exec(model);
  VirtualClock clock;
  Engine e(w, generate_requests(w), exec, clock);
  const Summary s = e.run();
  for (const Request& r : e.requests())
    REQUIRE_MESSAGE(r.status == RequestStatus::Finished, "request ", r.id, " ended ", to_string(r.status));
  if (stats) *stats = model.stats();
  if (summary) *summary = s;
  return e.outputs();
}

std::vector<std::vector<Token>> golden_on_gpu(const std::vector<Override>& overrides, bool graphs,
                                              cuda::CudaModelStats* stats = nullptr,
                                              cuda::AttentionKernel kernel = cuda::AttentionKernel::Simt,
                                              const std::string& workload = "workloads/golden_small.yaml",
                                              Summary* summary = nullptr) {
  cuda::CudaModelOptions o = opts(true, 1, false, kernel);
  o.cuda_graph = graphs;
  return golden_with(overrides, o, workload, stats, summary);
}
}  // namespace

TEST_CASE("golden on the GPU: static vs continuous, CUDA Graphs on and off, token-identical (each attention kernel)") {
  for (const auto kernel : kAttentionKernels) {
    CAPTURE(name(kernel));
    const auto base =
        golden_on_gpu({kNoChunking, {"engine.policy", "static"}, {"engine.max_num_seqs", "8"}}, false, nullptr, kernel);
    size_t tokens = 0;
    for (const auto& o : base) tokens += o.size();
    MESSAGE("baseline (static, eager): ", base.size(), " requests, ", tokens, " output tokens");
    struct Run {
      std::string label;
      std::vector<Override> overrides;
      bool graphs;
    };
    const std::vector<Run> runs = {
        {"static, graphs on", {kNoChunking, {"engine.policy", "static"}, {"engine.max_num_seqs", "8"}}, true},
        {"continuous 16 seats, graphs off", {kNoChunking}, false},
        {"continuous 16 seats, graphs on", {kNoChunking}, true},
        {"continuous 2 seats, graphs on", {kNoChunking, {"engine.max_num_seqs", "2"}}, true},
        {"continuous 40 seats, budget 600, graphs on",
         {kNoChunking, {"engine.max_num_seqs", "40"}, {"engine.max_num_batched_tokens", "600"}},
         true},
    };
    for (const Run& run : runs) {
      cuda::CudaModelStats st;
      const auto out = golden_on_gpu(run.overrides, run.graphs, &st, kernel);
      bool same = out == base;
      CHECK_MESSAGE(same, run.label, ": outputs differ from the baseline");
      MESSAGE(name(kernel), ", ", run.label, ": ", st.eager_steps, " eager steps, ", st.graph_captures,
              " graph captures, ", st.graph_replays, " replays");
      if (run.graphs)
        CHECK_MESSAGE(st.graph_replays > 0, run.label, ": no step replayed a graph");
      else
        CHECK(st.graph_replays == 0);
    }
  }
}

TEST_CASE(
    "golden on the GPU (stage 2): chunked prefill on vs off, budgets 16, 61, 512, CUDA Graphs on and off (each "
    "attention kernel)") {
  for (const auto kernel : kAttentionKernels) {
    CAPTURE(name(kernel));
    cuda::CudaModelStats base_stats;
    const auto base = golden_on_gpu({kNoChunking}, false, &base_stats, kernel);
    if (is_split(kernel)) CHECK(base_stats.split_inblock_steps > 0);  // prompts > 64 tokens
    for (const std::string budget : {"16", "61", "512"})
      for (const bool graphs : {false, true}) {
        cuda::CudaModelStats st;
        const auto out =
            golden_on_gpu({{"engine.enable_chunked_prefill", "true"}, {"engine.max_num_batched_tokens", budget}},
                          graphs, &st, kernel);
        CHECK_MESSAGE(out == base, "budget ", budget, ", graphs ", graphs,
                      ": outputs differ from the unchunked baseline");
        MESSAGE(name(kernel), ", chunked at ", budget, ", graphs ", graphs, ": ", st.eager_steps, " eager steps, ",
                st.graph_replays, " replays, split-KV steps spread/in-block ", st.split_spread_steps, "/",
                st.split_inblock_steps);
        // Split-KV: chunks of up to 64 tokens and decodes spread their splits, longer prompts
        // walk them in each block; the outputs above agree only if both ways are one function.
        if (is_split(kernel)) CHECK(st.split_spread_steps > 0);
        if (graphs) CHECK_MESSAGE(st.graph_replays > 0, "budget ", budget, ": no step replayed a graph");
      }
  }
}

// Stage 3 (workloads/golden_prefix.yaml: shared 200- and 240-token prefixes, prompts sharing
// all but their last token, prompts that are prefixes of each other, identical prompts): caching
// on, unchunked and chunked at 16, 61 and 512, graphs off and on, and a 40-block cache that
// evicts, against caching off. A hit that leaves one prompt token to compute is a decode-shaped
// step, so it also replays a graph over blocks another request wrote. The executor reports
// 1 us per step, so at the file's 60 requests/s every request would run alone: 300,000/s
// batches them (about 4 sequences a step, up to 9), as the CPU's measured steps do.
TEST_CASE(
    "golden on the GPU (stage 3): prefix caching on vs off, chunked and not, CUDA Graphs on and off (each attention "
    "kernel)") {
  const std::string wl = "workloads/golden_prefix.yaml";
  const Override caching_on{"engine.enable_prefix_caching", "true"}, rate{"requests.arrival.rate", "300000"};
  for (const auto kernel : kAttentionKernels) {
    CAPTURE(name(kernel));
    const auto base =
        golden_on_gpu({rate, kNoChunking, {"engine.enable_prefix_caching", "false"}}, false, nullptr, kernel, wl);
    struct Run {
      std::string label;
      std::vector<Override> overrides;
      bool graphs, evicts;
    };
    std::vector<Run> runs;
    for (const std::string budget : {"unchunked", "16", "61", "512"})
      for (const bool graphs : {false, true}) {
        std::vector<Override> o = {rate, caching_on, kNoChunking};
        if (budget != "unchunked")
          o = {rate, caching_on, {"engine.enable_chunked_prefill", "true"}, {"engine.max_num_batched_tokens", budget}};
        runs.push_back({budget == "unchunked" ? budget : "chunked at " + budget, o, graphs, false});
      }
    runs.push_back({"chunked at 61, 40 KV blocks",
                    {rate,
                     caching_on,
                     {"engine.enable_chunked_prefill", "true"},
                     {"engine.max_num_batched_tokens", "61"},
                     {"engine.num_kv_blocks", "40"}},
                    true,
                    true});
    for (const Run& run : runs) {
      cuda::CudaModelStats st;
      Summary s;
      const auto out = golden_on_gpu(run.overrides, run.graphs, &st, kernel, wl, &s);
      CHECK_MESSAGE(out == base, run.label, ", graphs ", run.graphs,
                    ": outputs differ from the baseline (caching off, unchunked)");
      MESSAGE(name(kernel), ", stage 3, caching on, ", run.label, ", graphs ", run.graphs, ": ", s.prefix_hit_tokens,
              " of ", s.prefix_queried_tokens, " prompt tokens hit, ", s.prefix_evictions, " evictions, ",
              st.eager_steps, " eager steps, ", st.graph_replays, " replays");
      CHECK_MESSAGE(s.prefix_hit_tokens > 0, run.label, ": no prefix hit");
      if (run.evicts) CHECK_MESSAGE(s.prefix_evictions > 0, run.label, ": no cached block was evicted");
      if (run.graphs) CHECK_MESSAGE(st.graph_replays > 0, run.label, ": no step replayed a graph");
    }
  }
}

TEST_CASE("the four attention kernels compute the same function (not bit for bit)") {
  for (const auto other : {cuda::AttentionKernel::Mma, cuda::AttentionKernel::Split, cuda::AttentionKernel::MmaSplit}) {
    const double err = logits_rel_err(bf16_model(4, 1, 512), opts(true, 1, false, cuda::AttentionKernel::Simt),
                                      opts(true, 1, false, other), 2, 31, 300);
    MESSAGE(name(other), " vs simt attention, logits rel err ", err);
    CHECK(err < 2e-2);
  }
}

TEST_CASE("RMSNorm/RoPE v2 (loads first) gives v1's logits bit for bit (1, 37, 300 tokens) and the golden outputs") {
  for (const ModelSpec& m : {bf16_model(4, 1, 512), bf16_model(4, 2, 256)}) {
    cuda::CudaModelOptions v2 = opts();
    v2.row_kernels = cuda::RowKernels::V2;
    for (const int32_t n : {1, 37, 300}) {
      CAPTURE(n);
      CHECK(logits_rel_err(m, opts(), v2, 2, 41, n) == 0.0);
    }
  }
  // Through the engine: the golden workload's outputs with v1 and with v2, graphs on.
  const auto outputs = [](cuda::RowKernels rk) {
    cuda::CudaModelOptions o = opts();
    o.row_kernels = rk;
    return golden_with({kNoChunking}, o);
  };
  CHECK(outputs(cuda::RowKernels::V1) == outputs(cuda::RowKernels::V2));
}

// engine.cuda_gemm: own (the own tensor-core GEMM for every shape, skinny up to 64 rows): golden
// outputs unchunked (prompts over 64 tokens: the tiled kernel) == chunked at 16 and 61 (the
// skinny kernel), graphs on and off.
TEST_CASE("golden on the GPU with the own GEMM: chunked at 16 and 61 vs unchunked, graphs on and off") {
  const auto run = [](const std::vector<Override>& overrides, bool graphs) {
    cuda::CudaModelOptions o = opts();
    o.gemm_own_kernel = true;
    o.cuda_graph = graphs;
    return golden_with(overrides, o);
  };
  const auto base = run({kNoChunking}, false);
  for (const std::string budget : {"16", "61"})
    for (const bool graphs : {false, true}) {
      CAPTURE(budget);
      CAPTURE(graphs);
      CHECK(run({{"engine.enable_chunked_prefill", "true"}, {"engine.max_num_batched_tokens", budget}}, graphs) ==
            base);
    }
  // The same function as the pinned cuBLASLt algorithms, within bf16 tolerance (not bit for bit).
  const double err = logits_rel_err(
      bf16_model(4, 1, 512), opts(),
      [] {
        cuda::CudaModelOptions o = opts();
        o.gemm_own_kernel = true;
        return o;
      }(),
      2, 31, 40);
  MESSAGE("own vs pinned GEMM, logits rel err ", err);
  CHECK(err < 2e-2);
}

namespace {
std::vector<float> random_floats(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(r.uniform(-1, 1));
  return v;
}
}  // namespace

TEST_CASE("poison writes NaN to every element; NCCL all-reduce at TP 1 is the identity, bit for bit") {
  const size_t n = (1u << 20) + 3;
  TANDEM_CUDA_CHECK(cudaSetDevice(0));
  cuda::DeviceBuffer<float> d(n);
  cuda::poison(d.get(), n);
  std::vector<float> h(n, 0.0f);
  TANDEM_CUDA_CHECK(cudaMemcpy(h.data(), d.get(), n * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(std::count_if(h.begin(), h.end(), [](float x) { return x != x; }) == long(n));
  const auto src = random_floats(n, 1);
  TANDEM_CUDA_CHECK(cudaMemcpy(d.get(), src.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  cuda::NcclCommunicator comm(1);
  float* bufs[] = {d.get()};
  comm.all_reduce_sum(bufs, n);
  TANDEM_CUDA_CHECK(cudaMemcpy(h.data(), d.get(), n * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(same_bits(h, src));
}

TEST_CASE("NCCL at TP 2 sums like the CPU communicator (where two GPUs exist)") {
  if (cuda::device_count() < 2) {
    MESSAGE("SKIP NCCL TP 2: ", cuda::device_count(), " GPU here; NCCL needs one GPU per rank");
    return;
  }
  const size_t n = (1u << 20) + 3;
  std::vector<std::vector<float>> host = {random_floats(n, 2), random_floats(n, 3)};
  std::vector<cuda::DeviceBuffer<float>> dev;
  std::vector<float*> ptrs;
  for (int r = 0; r < 2; ++r) {
    TANDEM_CUDA_CHECK(cudaSetDevice(r));
    dev.emplace_back(n);
    ptrs.push_back(dev.back().get());
    TANDEM_CUDA_CHECK(cudaMemcpy(ptrs.back(), host[size_t(r)].data(), n * sizeof(float), cudaMemcpyHostToDevice));
  }
  cuda::NcclCommunicator comm(2);
  comm.all_reduce_sum(ptrs, n);
  float* hb[] = {host[0].data(), host[1].data()};
  cpu::InProcessCommunicator(2).all_reduce_sum(hb, n);
  for (int r = 0; r < 2; ++r) {
    std::vector<float> got(n);
    TANDEM_CUDA_CHECK(cudaSetDevice(r));
    TANDEM_CUDA_CHECK(cudaMemcpy(got.data(), ptrs[size_t(r)], n * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(same_bits(got, host[0]));
  }
  TANDEM_CUDA_CHECK(cudaSetDevice(0));
}
