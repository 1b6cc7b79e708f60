// Stage 4 on the GPU: the CUDA executor's KV store and the device channels. Block bytes
// round-trip through host memory and from pool to pool (chunked, out of order, across GPUs where
// two exist); 1P1D over copy (host staging, and device to device) and over nccl (two GPUs) decodes
// token for token what one colocated instance decodes, CUDA Graphs on and off; a channel that
// moves nothing makes the comparison fail, so it cannot pass vacuously.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda_channels.h"
#include "backend/cuda/cuda_executor.h"
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/device.h"
#include "backend/cuda/kv_blocks.h"
#include "backend/cuda/nccl_channel.h"
#include "core/error.h"
#include "core/rng.h"
#include "sim/engine/clock.h"
#include "sim/engine/engine.h"
#include "sim/run/executors.h"
#include "sim/run/run_setup.h"
#include "sim/workload/workload_gen.h"
#include "tests/test_helpers.h"

using namespace tandem;

namespace {

const std::string kGolden = "workloads/golden_prefix.yaml";  // tiny model: 4 layers, 4 KV heads of 32
const Override kPd{"disaggregation.enabled", "true"}, kNoChunking{"engine.enable_chunked_prefill", "false"};

Override channel(const std::string& kind) { return {"disaggregation.channel.kind", kind}; }

std::vector<std::byte> random_bytes(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = std::byte(rng.next() & 0xff);
  return v;
}

// The tiny model of the golden workload on `device` (tp GPUs from there), `blocks` KV blocks.
cuda::CudaModelOptions model_options(int32_t device, int32_t tp = 1, int64_t staging_bytes = int64_t{64} << 20) {
  cuda::CudaModelOptions o;
  o.first_device = device;
  o.tp = tp;
  o.max_step_tokens = 512;
  o.max_step_seqs = 16;
  o.kv_staging_bytes = staging_bytes;
  return o;
}
ModelSpec tiny_model() { return load_workload(testing::source_path(kGolden)).model; }

// A block's bytes on the host, in the executor's layout: rank by rank, layer by layer, K then V.
std::vector<std::byte> block_of(const std::vector<std::byte>& buf, size_t i, int64_t block_bytes) {
  return {buf.begin() + ptrdiff_t(i * size_t(block_bytes)), buf.begin() + ptrdiff_t((i + 1) * size_t(block_bytes))};
}

// The CUDA executor of a workload, its options from the engine section (sim/run/executors.h).
std::unique_ptr<executor_i> cuda_executor_for(Workload& w) {
  return cuda::make_cuda_executor(w.model, w.seed, cuda_executor_options(w.engine));
}

// Empty if every request decoded the same tokens, else the first request and position that differ
// (as tests/golden.h's, which lives in the CPU golden suite).
std::string first_divergence(const std::vector<std::vector<Token>>& base,
                             const std::vector<std::vector<Token>>& other) {
  if (base.size() != other.size()) return fmt::format("{} vs {} requests", base.size(), other.size());
  for (size_t r = 0; r < base.size(); ++r)
    if (base[r] != other[r]) {
      const size_t p = size_t(std::mismatch(base[r].begin(), base[r].end(), other[r].begin(), other[r].end()).first -
                              base[r].begin());
      return fmt::format("request {} diverges at output position {} ({} vs {} tokens)", r, p, base[r].size(),
                         other[r].size());
    }
  return "";
}

KvTransfer kv_transfer(std::span<const int32_t> src, std::span<const int32_t> dst) {
  KvTransfer t;
  t.ticket = 1;
  t.num_tokens = int32_t(src.size()) * 16;
  t.src_blocks = src;
  t.dst_blocks = dst;
  return t;
}

// Moves nothing and reports success: the control that shows the golden comparison can fail.
class DroppingChannel final : public kv_channel_i {
 public:
  std::string name() const override { return "drop"; }
  TransferStart start(const KvTransfer& t) override {
    TransferStart r;
    r.bytes = int64_t(t.src_blocks.size());
    return r;
  }
  bool abort(uint64_t, Time) override { return true; }
};

struct GpuRun {
  std::vector<std::vector<Token>> outputs;
  std::vector<Request> requests;
  Summary summary;
  cuda::CudaModelStats decode_stats;  // the last instance's (decode in 1P1D)
  std::string channel;
};

// One workload on the CUDA backend set up as `tandem run` sets it up (RunSetup), with
// the virtual clock (measured step times, no waiting). `channels`: the device channels' factory,
// or none (copy then goes through host memory: CopyChannel and the executors' KV stores).
GpuRun run_on_gpu(const std::vector<Override>& overrides, const ChannelFactory* channels) {
  Workload w = load_workload(testing::source_path(kGolden), overrides);
  const ExecutorFactory factory = cuda_executor_for;
  RunSetup setup(std::move(w),
                 {.backend = "cuda", .clock = "virtual", .cuda = &factory, .channels = channels, .warm_up = false});
  const RunExecutors& exec = setup.exec;
  Engine& e = setup.start(generate_requests(setup.workload));
  GpuRun run;
  run.summary = e.run();
  run.outputs = e.outputs();
  run.requests = e.requests();
  run.decode_stats = cuda::cuda_model_of(*exec.executors.back())->stats();
  run.channel = exec.channel ? exec.channel->name() : "";
  return run;
}

// Every request finished; each with more than one output token moved its KV exactly once.
void check_transfers(const GpuRun& run, const std::string& label) {
  for (const Request& r : run.requests)
    REQUIRE_MESSAGE(r.status == RequestStatus::Finished, label, ": request ", r.id, " ended ", to_string(r.status));
  int64_t multi = 0;
  for (const Request& r : run.requests) multi += r.max_output > 1;
  const DisaggregationFigures& d = run.summary.disaggregation;
  CHECK(d.enabled);
  CHECK_MESSAGE(d.delivered == multi, label);
  CHECK_MESSAGE(d.delivered > 0, label);
  CHECK_MESSAGE(d.bytes > 0, label);
  CHECK_MESSAGE(d.failed == 0, label);
}

const std::vector<Override> kBaseline = {kNoChunking, {"engine.enable_prefix_caching", "false"}};

}  // namespace

TEST_CASE("cuda pd: the KV store round-trips random bytes, in chunks, blocks in any order (TP 1, and 2 on two GPUs)") {
  const ModelSpec m = tiny_model();
  for (const int32_t tp : {1, 2}) {
    if (tp > cuda::device_count()) {
      MESSAGE("SKIP KV store at TP 2: ", cuda::device_count(), " GPU here");
      continue;
    }
    CAPTURE(tp);
    const int64_t bb = int64_t(m.kv_bytes_per_token(2)) * 16;  // every rank's K and V, bf16
    // Chunks of 3 blocks per rank: 7 blocks cross two chunk edges.
    cuda::CudaModel model(m, nullptr, 1, 64, 16, model_options(0, tp, 3 * bb / tp));
    CHECK(model.kv_block_bytes() == bb);
    CHECK(model.kv_num_blocks() == 64);
    CHECK(model.kv_pools().size() == size_t(tp));
    model.randomize_kv_cache(5);
    const std::vector<int32_t> untouched = {10, 62};
    std::vector<std::byte> before(untouched.size() * size_t(bb));
    model.read_kv_blocks(untouched, before);

    const std::vector<int32_t> blocks = {9, 3, 4, 5, 63, 0, 40};  // a run, out of order, both ends of the pool
    const std::vector<std::byte> in = random_bytes(blocks.size() * size_t(bb), 11);
    model.write_kv_blocks(blocks, in);
    std::vector<std::byte> out(in.size());
    model.read_kv_blocks(blocks, out);
    CHECK(out == in);
    // Where the bytes went: in each rank's cache, each layer's K and V of that block hold the
    // block's pieces in order (rank by rank, layer by layer, K then V).
    int64_t rank_offset = 0;
    for (const cuda::KvPoolView& pool : model.kv_pools()) {
      const size_t i = 0, lbb = size_t(pool.layer_block_bytes);  // block 9, the buffer's first
      for (int32_t l = 0; l < pool.layers; ++l)
        for (const int half : {0, 1}) {
          std::vector<std::byte> piece(lbb);
          const std::byte* at = (half ? pool.v : pool.k) + (size_t(l) * size_t(pool.num_blocks) + 9) * lbb;
          TANDEM_CUDA_CHECK(cudaMemcpy(piece.data(), at, lbb, cudaMemcpyDeviceToHost));
          const size_t from = i * size_t(bb) + size_t(rank_offset) + (size_t(l) * 2 + size_t(half)) * lbb;
          CHECK_MESSAGE(std::equal(piece.begin(), piece.end(), in.begin() + ptrdiff_t(from)), "GPU ", pool.device,
                        ", layer ", l, half ? " V" : " K");
        }
      rank_offset += pool.block_bytes();
    }
    CHECK(rank_offset == bb);
    // Block by block in another order: each block's bytes follow it.
    const std::vector<int32_t> reversed(blocks.rbegin(), blocks.rend());
    model.read_kv_blocks(reversed, out);
    for (size_t i = 0; i < blocks.size(); ++i) CHECK(block_of(out, blocks.size() - 1 - i, bb) == block_of(in, i, bb));
    std::vector<std::byte> after(before.size());
    model.read_kv_blocks(untouched, after);
    CHECK(after == before);

    CHECK_THROWS_AS(model.read_kv_blocks(std::vector<int32_t>{64}, std::span<std::byte>(out.data(), size_t(bb))),
                    std::invalid_argument);
    CHECK_THROWS_AS(model.write_kv_blocks(blocks, std::span<const std::byte>(in.data(), in.size() - 1)),
                    std::invalid_argument);
  }
  TANDEM_CUDA_CHECK(cudaSetDevice(0));
}

TEST_CASE("cuda pd: the executor's kv_store is the model's blocks") {
  Workload w = load_workload(testing::source_path(kGolden), {{"engine.num_kv_blocks", "32"}});
  std::unique_ptr<executor_i> exec = cuda_executor_for(w);
  kv_store_i* kv = exec->kv_store();
  REQUIRE(kv != nullptr);
  CHECK(kv->num_blocks() == 32);
  CHECK(kv->block_bytes() == int64_t(w.model.kv_bytes_per_token(2)) * w.engine.block_size);
  const std::vector<int32_t> blocks = {31, 2};
  const std::vector<std::byte> in = random_bytes(2 * size_t(kv->block_bytes()), 3);
  kv->write_blocks(blocks, in);
  std::vector<std::byte> out(in.size());
  cuda::cuda_model_of(*exec)->read_kv_blocks(blocks, out);
  CHECK(out == in);
}

TEST_CASE("cuda pd: the device channels move blocks pool to pool (one GPU; peer copy and NCCL on two)") {
  const ModelSpec m = tiny_model();
  const int gpus = cuda::device_count();
  const int64_t bb = int64_t(m.kv_bytes_per_token(2)) * 16;
  const std::vector<int32_t> src = {3, 4, 5, 9, 60, 0, 1}, dst = {40, 1, 2, 47, 0, 20, 21};
  const std::vector<std::byte> in = random_bytes(src.size() * size_t(bb), 17);
  struct Case {
    std::string label;
    int32_t to_device;
    bool nccl;
  };
  std::vector<Case> cases = {{"one GPU, device copy", 0, false}};
  if (gpus >= 2) {
    cases.push_back({"two GPUs, peer copy", 1, false});
    cases.push_back({"two GPUs, nccl", 1, true});
  } else {
    MESSAGE("SKIP the device channels across GPUs: ", gpus, " GPU here");
  }
  for (const Case& c : cases) {
    CAPTURE(c.label);
    cuda::CudaModel from(m, nullptr, 1, 64, 16, model_options(0)),
        to(m, nullptr, 1, 48, 16, model_options(c.to_device));
    to.randomize_kv_cache(9);
    from.write_kv_blocks(src, in);
    std::unique_ptr<kv_channel_i> ch;
    if (c.nccl)
      ch = std::make_unique<cuda::NcclChannel>(from, to);
    else
      ch = std::make_unique<cuda::DeviceCopyChannel>(from, to);
    const TransferStart r = ch->start(kv_transfer(src, dst));
    REQUIRE(r.ok);
    CHECK(!r.async);
    CHECK(r.bytes == int64_t(src.size()) * bb);
    CHECK(r.elapsed > 0);
    std::vector<std::byte> out(in.size());
    to.read_kv_blocks(dst, out);
    CHECK(out == in);
    CHECK(ch->abort(1, 0));
    // A count mismatch fails the transfer; a block outside a pool is refused before any copy.
    const std::vector<int32_t> short_dst(dst.begin(), dst.end() - 1), bad_dst = {48};
    const TransferStart bad = ch->start(kv_transfer(src, short_dst));
    CHECK(!bad.ok);
    CHECK(!bad.error.empty());
    CHECK_THROWS_AS(ch->start(kv_transfer(std::span(src).first(1), bad_dst)), std::invalid_argument);
  }
  // The mover alone, two blocks per chunk: a transfer of 7 crosses three chunk edges.
  cuda::CudaModel a(m, nullptr, 1, 64, 16, model_options(0)), b(m, nullptr, 1, 48, 16, model_options(0));
  a.write_kv_blocks(src, in);
  cuda::KvBlockMove move(a.kv_pools()[0], b.kv_pools()[0], 2 * bb);
  move.run(src, dst);
  std::vector<std::byte> out(in.size());
  b.read_kv_blocks(dst, out);
  CHECK(out == in);
  // Blocks of another shape (block size 32) are refused.
  cuda::CudaModel other(m, nullptr, 1, 16, 32, model_options(0));
  CHECK_THROWS_AS(cuda::DeviceCopyChannel(a, other), std::invalid_argument);
  TANDEM_CUDA_CHECK(cudaSetDevice(0));
}

TEST_CASE(
    "cuda pd: golden 1P1D over copy on one GPU (host staging and device to device) vs colocated, token-identical, "
    "CUDA Graphs on and off") {
  const GpuRun base = run_on_gpu(kBaseline, nullptr);
  const ChannelFactory device_channels = cuda::make_cuda_channel;
  struct Case {
    std::string label;
    std::vector<Override> overrides;
    bool evicts;
  };
  const std::vector<Case> cases = {
      {"unchunked, caching on", {kNoChunking}, false},
      {"chunked at 61, caching on, P holds 40 blocks",
       {{"engine.max_num_batched_tokens", "61"}, {"disaggregation.prefill.num_kv_blocks", "40"}},
       true},
  };
  for (const bool device : {false, true})
    for (const bool graphs : {false, true})
      for (const Case& c : cases) {
        const std::string label =
            fmt::format("{}, {}, graphs {}", device ? "device copy" : "host copy", c.label, graphs ? "on" : "off");
        std::vector<Override> o = c.overrides;
        o.insert(o.end(), {kPd, channel("copy"), {"engine.cuda_graph", graphs ? "true" : "false"}});
        const GpuRun run = run_on_gpu(o, device ? &device_channels : nullptr);
        CHECK(run.channel == (device ? "device-copy" : "copy"));
        check_transfers(run, label);
        const std::string d = first_divergence(base.outputs, run.outputs);
        CHECK_MESSAGE(d.empty(), label, ": ", d);
        if (c.evicts) CHECK_MESSAGE(run.summary.prefix_evictions > 0, label, ": no cached block was evicted");
        if (graphs)
          CHECK_MESSAGE(run.decode_stats.graph_replays > 0, label, ": the decode instance replayed no graph");
        else
          CHECK(run.decode_stats.graph_replays == 0);
        const DisaggregationFigures& f = run.summary.disaggregation;
        MESSAGE("1P1D ", label, ": ", f.delivered, " transfers, ", f.bytes, " bytes, transfer p50 ", f.transfer_ms.p50,
                " ms, ", run.decode_stats.graph_replays, " decode replays; identical");
      }
  // The control: a channel that moves nothing must make some request diverge.
  const ChannelFactory dropping = [](const std::string&, executor_i&, executor_i&) {
    return std::unique_ptr<kv_channel_i>(std::make_unique<DroppingChannel>());
  };
  const GpuRun dropped = run_on_gpu({kNoChunking, kPd, channel("copy")}, &dropping);
  CHECK(dropped.channel == "drop");
  CHECK_MESSAGE(!first_divergence(base.outputs, dropped.outputs).empty(),
                "1P1D without the KV moved decoded the same tokens: the comparison cannot fail");
}

TEST_CASE("cuda pd: golden 1P1D over nccl on two GPUs vs colocated, token-identical, CUDA Graphs on and off") {
  if (cuda::device_count() < 2) {
    MESSAGE("SKIP nccl 1P1D: ", cuda::device_count(), " GPU here; the nccl channel needs 2");
    return;
  }
  const GpuRun base = run_on_gpu(kBaseline, nullptr);
  const ChannelFactory device_channels = cuda::make_cuda_channel;
  for (const bool graphs : {false, true}) {
    const std::string label = fmt::format("nccl, GPU 0 -> 1, graphs {}", graphs ? "on" : "off");
    const GpuRun run = run_on_gpu({kNoChunking,
                                   kPd,
                                   channel("nccl"),
                                   {"disaggregation.decode.device", "1"},
                                   {"engine.cuda_graph", graphs ? "true" : "false"}},
                                  &device_channels);
    CHECK(run.channel == "nccl");
    check_transfers(run, label);
    const std::string d = first_divergence(base.outputs, run.outputs);
    CHECK_MESSAGE(d.empty(), label, ": ", d);
    if (graphs) CHECK_MESSAGE(run.decode_stats.graph_replays > 0, label, ": the decode instance replayed no graph");
    const DisaggregationFigures& f = run.summary.disaggregation;
    MESSAGE("1P1D ", label, ": ", f.delivered, " transfers, ", f.bytes, " bytes, transfer p50 ", f.transfer_ms.p50,
            " ms; identical");
  }
  TANDEM_CUDA_CHECK(cudaSetDevice(0));
}

TEST_CASE("cuda pd: the nccl channel says what it needs (2 GPUs, tp 1, two different GPUs)") {
  const ChannelFactory device_channels = cuda::make_cuda_channel;
  const auto build = [&](const std::vector<Override>& extra) {
    std::vector<Override> o = {kPd, channel("nccl")};
    o.insert(o.end(), extra.begin(), extra.end());
    Workload w = load_workload(testing::source_path(kGolden), o);
    const ExecutorFactory factory = cuda_executor_for;
    return std::make_unique<RunSetup>(
        std::move(w),
        RunSetupOptions{
            .backend = "cuda", .clock = "virtual", .cuda = &factory, .channels = &device_channels, .warm_up = false});
  };
  // Without the factory (a caller that hands none), nccl is refused by name.
  Workload w = load_workload(testing::source_path(kGolden), {kPd, channel("nccl")});
  const ExecutorFactory factory = cuda_executor_for;
  CHECK_THROWS_WITH_AS(RunSetup(w, {.backend = "cuda", .clock = "virtual", .cuda = &factory}),
                       doctest::Contains("nccl moves KV between two GPUs"), InputError);
  const int gpus = cuda::device_count();
  if (gpus < 2) {
    const std::string needs = fmt::format("the nccl channel needs 2 GPUs; this machine has {}", gpus);
    CHECK_THROWS_WITH_AS(build({}), needs.c_str(), std::runtime_error);
    return;
  }
  CHECK_THROWS_WITH_AS(build({}), doctest::Contains("both on GPU 0"), InputError);
  CHECK_THROWS_WITH_AS(build({{"engine.tp", "2"}}), doctest::Contains("prefill has tp 2"), InputError);
  TANDEM_CUDA_CHECK(cudaSetDevice(0));
}
