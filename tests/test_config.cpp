// Workload parsing: resolved values, and errors that name file:line:column and the field.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/rng.h"
#include "sim/workload/config.h"
#include "sim/workload/prompt_hashes.h"
#include "sim/workload/traces.h"
#include "sim/workload/workload_gen.h"
#include "tests/test_helpers.h"

using namespace tandem;
using tandem::testing::as_if_in_workloads_dir;

namespace {
const char* kBase = R"(seed: 3
model: llama3-8b
hardware: h200
requests:
  count: 10
  arrival: {process: poisson, rate: 5}
  prompt_len: 100
  output_len: {dist: uniform, min: 5, max: 10}
)";

std::string error_of(const std::string& yaml, const std::vector<Override>& o = {}) {
  try {
    parse_workload(yaml, "w.yaml", o);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("a minimal workload resolves presets and defaults") {
  Workload w = parse_workload(kBase, "w.yaml");
  CHECK(w.seed == 3);
  CHECK(w.model.layers == 32);
  CHECK(w.model.kv_heads == 8);
  CHECK(w.hardware.mem_bandwidth == doctest::Approx(4.3e12));
  CHECK(w.engine.block_size == 16);
  CHECK(w.engine.policy == BatchingPolicy::Continuous);
  // KV from memory: 141 GB * 0.9 - weights, over 16 tokens * 128 KiB per token.
  const double expect = std::floor((141e9 * 0.9 - w.model.weight_bytes()) / (16 * 131072.0));
  CHECK(w.engine.resolved_kv_blocks == int32_t(expect));
  CHECK(w.model.kv_bytes_per_token() == 131072.0);
}

TEST_CASE("unknown keys are errors with line, column and field") {
  const std::string e = error_of(std::string(kBase) + "engine:\n  max_num_seq: 8\n");
  CHECK(e.find("w.yaml:10:3") != std::string::npos);
  CHECK(e.find("engine.max_num_seq") != std::string::npos);
  CHECK(e.find("unknown field") != std::string::npos);
}

TEST_CASE("wrong types and impossible values name the field") {
  std::string e = error_of(std::string(kBase) + "engine:\n  max_num_seqs: lots\n");
  CHECK(e.find("w.yaml:10:17") != std::string::npos);
  CHECK(e.find("'engine.max_num_seqs'") != std::string::npos);
  CHECK(e.find("expected an integer") != std::string::npos);
  e = error_of(std::string(kBase) + "engine:\n  block_size: 0\n");
  CHECK(e.find("engine.block_size") != std::string::npos);
  CHECK(e.find("out of range") != std::string::npos);
  e = error_of(std::string(kBase) + "engine:\n  max_num_seqs: 2.5\n");
  CHECK(e.find("expected an integer") != std::string::npos);
  e = error_of(
      "model: llama3-8b\nhardware: h200\nrequests:\n  count: 5\n  arrival: {process: poisson, rate: -1}\n  prompt_len: "
      "1\n  output_len: 1\n");
  CHECK(e.find("requests.arrival.rate") != std::string::npos);
  e = error_of("model: llama9\nhardware: h200\n");
  CHECK(e.find("w.yaml:1:8") != std::string::npos);
  CHECK(e.find("unknown model preset 'llama9'") != std::string::npos);
  e = error_of(
      "model: llama3-8b\nhardware: h200\nrequests:\n  count: 5\n  arrival: {process: poisson, rate: 1}\n  prompt_len: "
      "{dist: uniform, min: 10, max: 5}\n  output_len: 1\n");
  CHECK(e.find("requests.prompt_len.max") != std::string::npos);
}

TEST_CASE("missing sections and broken YAML") {
  CHECK(error_of("model: llama3-8b\nhardware: h200\n").find("'requests': missing") != std::string::npos);
  CHECK(error_of("model: [llama3\n").find("w.yaml:") != std::string::npos);
  CHECK(error_of("hardware: h200\nrequests: {trace: {format: azure, path: x.csv}}\n").find("'model': missing") !=
        std::string::npos);
}

TEST_CASE("--set overrides by dotted path; unknown keys and bad values are caught") {
  Workload w = parse_workload(kBase, "w.yaml", {{"engine.max_num_seqs", "8"}, {"engine.policy", "static"}});
  CHECK(w.engine.max_num_seqs == 8);
  CHECK(w.engine.policy == BatchingPolicy::Static);
  w = parse_workload(kBase, "w.yaml", {{"hardware.step_overhead_us", "500"}});  // expands the preset
  CHECK(w.hardware.step_overhead_s == doctest::Approx(500e-6));
  CHECK(w.hardware.mem_bandwidth == doctest::Approx(4.3e12));
  std::string e = error_of(kBase, {{"engine.max_num_seq", "8"}});
  CHECK(e.find("--set engine.max_num_seq=8") != std::string::npos);
  CHECK(e.find("unknown field") != std::string::npos);
  e = error_of(kBase, {{"engine.max_num_seqs", "many"}});
  CHECK(e.find("--set engine.max_num_seqs=many") != std::string::npos);
}

TEST_CASE("CUDA backend knobs: defaults, values, bad values, and the resolved YAML round trip") {
  Workload d = parse_workload(kBase, "w.yaml");
  CHECK(d.engine.cuda_graph);
  CHECK(d.engine.cuda_attention == "simt");
  Workload w = parse_workload(std::string(kBase) + "engine: {cuda_graph: false, cuda_attention: mma}\n", "w.yaml");
  CHECK_FALSE(w.engine.cuda_graph);
  CHECK(w.engine.cuda_attention == "mma");
  const Workload again = parse_workload(to_yaml(w), "resolved.yaml");
  CHECK_FALSE(again.engine.cuda_graph);
  CHECK(again.engine.cuda_attention == "mma");
  const Workload split = parse_workload(std::string(kBase) + "engine: {cuda_attention: split}\n", "w.yaml");
  CHECK(split.engine.cuda_attention == "split");
  CHECK(parse_workload(to_yaml(split), "resolved.yaml").engine.cuda_attention == "split");
  // cuda_row_kernels: v1 by default and then absent from the resolved YAML (files written before stay
  // byte-identical); v2 round-trips; anything else names the field.
  CHECK(d.engine.cuda_row_kernels == "v1");
  CHECK(to_yaml(d).find("cuda_row_kernels") == std::string::npos);
  const Workload v2 = parse_workload(std::string(kBase) + "engine: {cuda_row_kernels: v2}\n", "w.yaml");
  CHECK(parse_workload(to_yaml(v2), "resolved.yaml").engine.cuda_row_kernels == "v2");
  const std::string bad = error_of(kBase, {{"engine.cuda_row_kernels", "v3"}});
  CHECK(bad.find("engine.cuda_row_kernels") != std::string::npos);
  CHECK(bad.find("known: v1, v2") != std::string::npos);
  // cuda_gemm: pinned by default (absent from the resolved YAML), own round-trips, others fail.
  CHECK(d.engine.cuda_gemm == "pinned");
  CHECK(to_yaml(d).find("cuda_gemm") == std::string::npos);
  const Workload own = parse_workload(std::string(kBase) + "engine: {cuda_gemm: own}\n", "w.yaml");
  CHECK(parse_workload(to_yaml(own), "resolved.yaml").engine.cuda_gemm == "own");
  const std::string bad_gemm = error_of(kBase, {{"engine.cuda_gemm", "cutlass"}});
  CHECK(bad_gemm.find("engine.cuda_gemm") != std::string::npos);
  CHECK(bad_gemm.find("known: pinned, own") != std::string::npos);
  const std::string e = error_of(kBase, {{"engine.cuda_attention", "flash"}});
  CHECK(e.find("engine.cuda_attention") != std::string::npos);
  CHECK(e.find("known: simt, mma, split, mma_split") != std::string::npos);
  CHECK(error_of(kBase, {{"engine.cuda_graph", "7"}}).find("engine.cuda_graph") != std::string::npos);
}

TEST_CASE("inline model and hardware; divisibility checked") {
  const std::string inl =
      R"(model: {layers: 2, hidden: 64, heads: 4, kv_heads: 2, ffn: 128, vocab: 100, max_model_len: 512, dtype: fp32}
hardware: {peak_tflops: 1, mem_bandwidth_tbs: 0.1, step_overhead_us: 10, memory_gb: 1}
engine: {num_kv_blocks: 77}
requests: {count: 3, arrival: {process: constant, rate: 1}, prompt_len: 8, output_len: 8}
)";
  Workload w = parse_workload(inl, "w.yaml");
  CHECK(w.model.head_dim() == 16);
  CHECK(w.model.dtype_bytes() == 4);
  CHECK(w.engine.resolved_kv_blocks == 77);
  CHECK(w.hardware.peak_flops == doctest::Approx(1e12));
  std::string bad = inl;
  bad.replace(bad.find("kv_heads: 2"), 11, "kv_heads: 3");
  CHECK(error_of(bad).find("model.kv_heads") != std::string::npos);
}

TEST_CASE("weights that leave no KV memory are an input error") {
  const std::string e = error_of(std::string(kBase) + "engine: {gpu_memory_utilization: 0.05}\n");
  CHECK(e.find("leave no memory for the KV cache") != std::string::npos);
}

TEST_CASE("KV capacity is per GPU: at tp 1, 2, 4 and 8 each rank holds its share of the weights and of every block") {
  // By hand, Llama-3-8B (bf16) on the h200 preset (141 GB a GPU) at gpu_memory_utilization 0.9:
  //   linear weights 32 x (2 x 4096 x 4096 + 2 x 4096 x 1024 + 3 x 4096 x 14336) = 6,979,321,856
  //   parameters = 13,958,643,712 bytes; embedding + LM head 2 x 4096 x 128,256 = 1,050,673,152
  //   parameters = 2,101,346,304 bytes, whole on every rank;
  //   a block: 16 tokens x 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes = 2,097,152 bytes in all.
  //   per rank: weights 13,958,643,712 / tp + 2,101,346,304; blocks = floor((126.9e9 - weights) / (2,097,152 / tp))
  struct Case {
    const char* tp;
    double rank_weights, rank_block_bytes;
    int32_t blocks;
  };
  for (const Case c : {Case{"1", 16'059'990'016, 2'097'152, 52'852},   // (126.9e9 - 16.06e9) / 2 MiB = 52,852.6
                       Case{"2", 9'080'668'160, 1'048'576, 112'361},   // 117.82e9 / 1 MiB = 112,361.3
                       Case{"4", 5'591'007'232, 524'288, 231'378},     // 121.31e9 / 512 KiB = 231,378.5
                       Case{"8", 3'846'176'768, 262'144, 469'413}}) {  // 123.05e9 / 256 KiB = 469,413.1
    CAPTURE(c.tp);
    const Workload w = parse_workload(kBase, "w.yaml", {{"engine.tp", c.tp}});
    CHECK(w.engine.resolved_kv_blocks == c.blocks);
    const KvCapacity k = kv_capacity(w.model, w.hardware, w.engine);
    CHECK(k.source == KvCapacity::Source::DeviceMemory);
    CHECK(k.weight_bytes_per_gpu == c.rank_weights);
    CHECK(k.block_bytes_per_gpu == c.rank_block_bytes);
    CHECK(k.kv_bytes_per_gpu == doctest::Approx(141e9 * 0.9 - c.rank_weights));
    // The resolved YAML writes the arithmetic out, and reads back to the same cache.
    const std::string y = to_yaml(w);
    CAPTURE(y);
    CHECK(y.find(fmt::format("= {} blocks", c.blocks)) != std::string::npos);
    CHECK(y.find(c.tp == std::string("1") ? "# KV cache: 141 GB x 0.9 - 16.06 GB weights = 110.84 GB / 2097152 bytes"
                                          : "GB linear weights / ") != std::string::npos);
    CHECK(parse_workload(y, "resolved.yaml").engine.resolved_kv_blocks == c.blocks);
  }
  // kv_memory_gb is per GPU too: 10 GB on each rank.
  for (const auto& [tp, blocks] : {std::pair{"1", 4768}, {"2", 9536}, {"4", 19073}}) {
    CAPTURE(tp);
    const Workload w = parse_workload(kBase, "w.yaml", {{"engine.tp", tp}, {"engine.kv_memory_gb", "10"}});
    CHECK(w.engine.resolved_kv_blocks == blocks);  // floor(10e9 / (2,097,152 / tp))
  }
  // num_kv_blocks stays as given at any tp.
  CHECK(parse_workload(kBase, "w.yaml", {{"engine.tp", "4"}, {"engine.num_kv_blocks", "1000"}})
            .engine.resolved_kv_blocks == 1000);
}

TEST_CASE("a model larger than one GPU fits when tp splits it: Llama-3-70B's shape at tp 4 on 80 GB cards") {
  // 80 layers, hidden 8192, 64/8 heads, ffn 28672, vocab 128256, bf16: 68,451,041,280 linear + 2,101,346,304
  // embedding parameters = 141.1 GB of weights, more than a card's 80 GB x 0.95 = 76 GB.
  const std::string base = R"(model: {layers: 80, hidden: 8192, heads: 64, kv_heads: 8, ffn: 28672, vocab: 128256,
        max_model_len: 8192, dtype: bf16}
hardware: {preset: h200, memory_gb: 80}
engine: {gpu_memory_utilization: 0.95}
requests: {count: 3, arrival: {process: constant, rate: 1}, prompt_len: 100, output_len: 10}
)";
  const std::string e = error_of(base);  // one card
  CHECK(e.find("the model's weights (141.1 GB) leave no memory for the KV cache (80.0 GB x gpu_memory_utilization "
               "0.95)") != std::string::npos);
  // tp 4: a rank holds 68,451,041,280 / 4 + 2,101,346,304 parameters = 38,428,213,248 bytes, leaving
  // 76e9 - 38,428,213,248 = 37,571,786,752 bytes for 16-token blocks of 16 x 2 x 80 x 2 x 128 x 2 = 1,310,720
  // bytes a rank: 28,664.998 -> 28,664 blocks.
  const Workload w = parse_workload(base, "w.yaml", {{"engine.tp", "4"}});
  CHECK(w.engine.resolved_kv_blocks == 28'664);
  // tp 2: 72.65 GB a rank leaves 3.35 GB: 1,276 blocks of 2,621,440 bytes a rank.
  CHECK(parse_workload(base, "w.yaml", {{"engine.tp", "2"}}).engine.resolved_kv_blocks == 1'276);
  // At tp 2 with less memory the message gives the per-GPU arithmetic.
  const std::string e2 = error_of(base, {{"engine.tp", "2"}, {"engine.gpu_memory_utilization", "0.9"}});
  CHECK(e2.find("field 'engine'") != std::string::npos);
  CHECK(e2.find("the model's weights per GPU (72.7 GB at tp 2: 136.9 GB linear / 2 ranks + 4.2 GB embedding and LM "
                "head) leave no memory") != std::string::npos);
}

TEST_CASE("stage 4: an instance with a tp of its own gets the KV cache of its own GPUs") {
  const std::string pd = std::string(kBase) + "disaggregation: {enabled: true, prefill: {tp: 2}}\n";
  const Workload w = parse_workload(pd, "w.yaml");
  CHECK(w.engine.resolved_kv_blocks == 52'852);  // tp 1, as in the test above
  const std::vector<InstanceSpec> in = instance_specs(w);
  REQUIRE(in.size() == 2);
  CHECK(in[0].role == InstanceRole::Prefill);
  CHECK(in[0].engine.tp == 2);
  CHECK(in[0].engine.resolved_kv_blocks == 112'361);  // two GPUs' worth, as the engine at tp 2
  CHECK(in[1].engine.tp == 1);
  CHECK(in[1].engine.resolved_kv_blocks == 52'852);
  CHECK(instance_workload(w, in[0]).engine.resolved_kv_blocks == 112'361);
  // The resolved YAML says how, and reads back to the same caches.
  const std::string y = to_yaml(w);
  CAPTURE(y);
  CHECK(y.find("# KV cache, prefill (tp 2): 141 GB x 0.9 - (13.96 GB linear weights / 2 ranks + 2.10 GB embedding "
               "and LM head, whole on each rank) = 117.82 GB per GPU / 1048576 bytes per block per GPU (16 tokens) "
               "= 112361 blocks; 2 ranks: 235.64 GB in all") != std::string::npos);
  CHECK(y.find("# KV cache, decode") == std::string::npos);
  const std::vector<InstanceSpec> again = instance_specs(parse_workload(y, "resolved.yaml"));
  CHECK(again[0].engine.resolved_kv_blocks == 112'361);
  CHECK(again[1].engine.resolved_kv_blocks == 52'852);
  // An instance's own num_kv_blocks, and the engine's, stay as given whatever the tp.
  const Workload given = parse_workload(pd, "w.yaml", {{"engine.num_kv_blocks", "5000"}});
  CHECK(instance_specs(given)[0].engine.resolved_kv_blocks == 5000);
  const Workload own = parse_workload(pd, "w.yaml", {{"disaggregation.prefill.num_kv_blocks", "700"}});
  CHECK(instance_specs(own)[0].engine.resolved_kv_blocks == 700);
  CHECK(instance_specs(own)[1].engine.resolved_kv_blocks == 52'852);
  // A decode instance at tp 4 that the weights would not leave room at tp 1 names its field.
  const std::string e = error_of(kBase, {{"disaggregation.enabled", "true"},
                                         {"disaggregation.decode.tp", "1"},
                                         {"engine.tp", "2"},
                                         {"engine.gpu_memory_utilization", "0.1"}});
  CHECK(e.find("field 'disaggregation.decode.tp'") != std::string::npos);
  CHECK(e.find("leave no memory for the KV cache") != std::string::npos);
}

TEST_CASE("stage 4: an instance's own hardware: parsed (preset, mapping over the workload's), emitted, sized") {
  const std::string pd = std::string(kBase) + "disaggregation: {enabled: true}\n";
  // A preset name: the PCIe-linked card for a tp 2 prefill instance.
  const Workload p = parse_workload(
      pd, "w.yaml", {{"disaggregation.prefill.hardware", "h200-pcie"}, {"disaggregation.prefill.tp", "2"}});
  REQUIRE(p.disaggregation.prefill.hardware);
  CHECK(p.disaggregation.prefill.hardware->name == "h200-pcie");
  CHECK(p.disaggregation.prefill.hardware->link_bandwidth == doctest::Approx(64e9));
  std::vector<InstanceSpec> in = instance_specs(p);
  CHECK(in[0].hardware.name == "h200-pcie");
  CHECK(in[1].hardware.name == "h200");  // the workload's
  CHECK(instance_workload(p, in[0]).hardware.link_bandwidth == doctest::Approx(64e9));
  CHECK(instance_workload(p, in[1]).hardware.link_bandwidth == doctest::Approx(450e9));
  CHECK(in[0].engine.resolved_kv_blocks == 112'361);  // the same memory as h200, at tp 2
  // A mapping without preset starts from the workload's hardware: only the numbers given change.
  // An 80 GB decode card: 80e9 x 0.9 - 16,059,990,016 = 55,940,009,984 bytes / 2,097,152 = 26,674.2 blocks.
  const Workload d = parse_workload(
      pd, "w.yaml", {{"disaggregation.decode.hardware", "{memory_gb: 80, mem_bandwidth_tbs: 2, name: slow}"}});
  REQUIRE(d.disaggregation.decode.hardware);
  const HardwareSpec& h = *d.disaggregation.decode.hardware;
  CHECK(h.name == "slow");
  CHECK(h.mem_bandwidth == doctest::Approx(2e12));
  CHECK(h.peak_flops == doctest::Approx(788e12));  // h200's
  CHECK(h.memory_bytes == doctest::Approx(80e9));
  in = instance_specs(d);
  CHECK(in[0].engine.resolved_kv_blocks == 52'852);
  CHECK(in[1].engine.resolved_kv_blocks == 26'674);
  CHECK(in[1].hardware.name == "slow");
  // Emitted: the section, the instance's predicted steps, its KV arithmetic and its numbers' source;
  // the output reads back to the same instances.
  const std::string y = to_yaml(d);
  CAPTURE(y);
  CHECK(y.find("    hardware:\n      name: slow\n      peak_tflops: 788\n      mem_bandwidth_tbs: 2\n") !=
        std::string::npos);
  CHECK(y.find("# predicted step times (ms), decode instance, hardware 'slow': decode 1 x 1024 ctx ") !=
        std::string::npos);
  CHECK(y.find("# KV cache, decode (tp 1): 80 GB x 0.9 - 16.06 GB weights = 55.94 GB / 2097152 bytes per block (16 "
               "tokens) = 26674 blocks") != std::string::npos);
  CHECK(y.find("# hardware numbers, decode instance: ") != std::string::npos);
  CHECK(y.find("prefill instance") == std::string::npos);
  const Workload again = parse_workload(y, "resolved.yaml");
  REQUIRE(again.disaggregation.decode.hardware);
  CHECK(again.disaggregation.decode.hardware->mem_bandwidth == doctest::Approx(2e12));
  CHECK(again.disaggregation.decode.hardware->memory_bytes == doctest::Approx(80e9));
  CHECK(instance_specs(again)[1].engine.resolved_kv_blocks == 26'674);
  CHECK_FALSE(again.disaggregation.prefill.hardware);
}

TEST_CASE("stage 4: per-instance fields that make no sense exit 2 naming the field") {
  const std::string pd = std::string(kBase) + "disaggregation: {enabled: true}\n";
  // A link of its own: the prefill-decode link is the channel's, the TP link the instance's hardware's.
  for (const char* key : {"link", "bandwidth_gbs", "latency_us", "link_bandwidth_gbs"}) {
    CAPTURE(key);
    const std::string e = error_of(pd, {{fmt::format("disaggregation.decode.{}", key), "10"}});
    CHECK(e.find(fmt::format("field 'disaggregation.decode.{}': an instance has no link of its own", key)) !=
          std::string::npos);
    CHECK(e.find("disaggregation.channel (bandwidth_gbs and latency_us, or profile)") != std::string::npos);
  }
  // An unknown preset, a bad number, a tp the instance's hardware has no link for.
  CHECK(error_of(pd, {{"disaggregation.prefill.hardware", "a100"}})
            .find("field 'disaggregation.prefill.hardware': unknown hardware preset 'a100'") != std::string::npos);
  CHECK(error_of(pd, {{"disaggregation.decode.hardware.mem_bandwidth_tbs", "-1"}})
            .find("field 'disaggregation.decode.hardware.mem_bandwidth_tbs'") != std::string::npos);
  CHECK(error_of(pd, {{"disaggregation.prefill.hardware.link_bandwidth_gbs", "0"}, {"disaggregation.prefill.tp", "2"}})
            .find("field 'disaggregation.prefill.hardware': tensor parallelism needs hardware.link_bandwidth_gbs") !=
        std::string::npos);
  // An instance's hardware whose memory the weights fill.
  CHECK(error_of(pd, {{"disaggregation.decode.hardware.memory_gb", "16"}})
            .find("field 'disaggregation.decode.hardware': the model's weights (16.1 GB) leave no memory") !=
        std::string::npos);
}

TEST_CASE("synthetic generation is deterministic and follows the distributions") {
  std::string y = R"(seed: 9
model: llama3-8b
hardware: h200
requests:
  count: 20000
  arrival: {process: poisson, rate: 50}
  prompt_len: {dist: lognormal, median: 500, sigma: 0.5, min: 10, max: 4000}
  output_len: {dist: mixture, components: [{weight: 3, dist: fixed, value: 10}, {weight: 1, dist: fixed, value: 100}]}
  shared_prefix: {groups: 4, prefix_len: 64, fraction: 0.5}
  cancel: {fraction: 0.1, after_s: {dist: uniform, min: 0.5, max: 1.0}}
)";
  Workload w = parse_workload(y, "w.yaml");
  RequestSet a = generate_requests(w), b = generate_requests(w);
  REQUIRE(a.requests.size() == 20000);
  int tens = 0, grouped = 0, cancels = 0;
  std::vector<double> prompts;
  for (size_t i = 0; i < a.requests.size(); ++i) {
    const Request& r = a.requests[i];
    CHECK(r.id == ReqId(i));
    CHECK(r.arrival == b.requests[i].arrival);
    CHECK(r.prompt_len == b.requests[i].prompt_len);
    if (i > 0) CHECK(r.arrival >= a.requests[i - 1].arrival);
    tens += r.max_output == 10;
    grouped += r.prefix_group >= 0;
    if (r.cancel_at != kNever) {
      ++cancels;
      CHECK(r.cancel_at - r.arrival >= from_seconds(0.5));
      CHECK(r.cancel_at - r.arrival <= from_seconds(1.0));
    }
    prompts.push_back(r.prompt_len);
  }
  std::sort(prompts.begin(), prompts.end());
  CHECK(prompts[prompts.size() / 2] == doctest::Approx(500).epsilon(0.03));
  CHECK(tens / 20000.0 == doctest::Approx(0.75).epsilon(0.03));
  CHECK(grouped / 20000.0 == doctest::Approx(0.5).epsilon(0.05));
  CHECK(cancels / 20000.0 == doctest::Approx(0.1).epsilon(0.1));
  CHECK(to_seconds(a.requests.back().arrival) == doctest::Approx(20000 / 50.0).epsilon(0.03));
  // Shared-prefix members share their leading token ids; others differ.
  PromptTokens tok(w.seed, w.model.vocab, a);
  const Request *g1 = nullptr, *g2 = nullptr;
  for (const Request& r : a.requests) {
    if (r.prefix_group != 0 || r.prompt_len < 80) continue;
    (g1 ? g2 : g1) = &r;
    if (g2) break;
  }
  REQUIRE(g2);
  for (int p = 0; p < 64; ++p) CHECK(tok.at(*g1, p) == tok.at(*g2, p));
  int same_after = 0;
  for (int p = 64; p < 80; ++p) same_after += tok.at(*g1, p) == tok.at(*g2, p);
  CHECK(same_after < 3);
}

TEST_CASE("gamma arrivals have the requested coefficient of variation") {
  std::string y = std::string(kBase);
  y.replace(y.find("count: 10"), 9, "count: 40000");
  y.replace(y.find("{process: poisson, rate: 5}"), 27, "{process: gamma, rate: 5, cv: 3}");
  RequestSet s = generate_requests(parse_workload(y, "w.yaml"));
  double sum = 0, sq = 0;
  for (size_t i = 1; i < s.requests.size(); ++i) {
    const double d = to_seconds(s.requests[i].arrival - s.requests[i - 1].arrival);
    sum += d;
    sq += d * d;
  }
  const double n = double(s.requests.size() - 1), mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  CHECK(mean == doctest::Approx(0.2).epsilon(0.05));
  CHECK(sd / mean == doctest::Approx(3.0).epsilon(0.1));
}

TEST_CASE("arrival normalize: the last of N arrivals at N / rate, as vLLM's bench serve; off by default") {
  std::string y = std::string(kBase);
  y.replace(y.find("count: 10"), 9, "count: 500");
  const RequestSet drawn = generate_requests(parse_workload(y, "w.yaml"));
  // Off: the drawn gaps, a few % from N / rate (100 s).
  const double last = to_seconds(drawn.requests.back().arrival);
  CHECK(last != doctest::Approx(100.0).epsilon(0.001));
  for (const char* proc : {"{process: poisson, rate: 5, normalize: true}", "{process: gamma, rate: 5, cv: 2, normalize: true}"}) {
    std::string z = y;
    z.replace(z.find("{process: poisson, rate: 5}"), 27, proc);
    const Workload w = parse_workload(z, "w.yaml");
    CHECK(w.requests.arrival.normalize);
    const RequestSet n = generate_requests(w);
    REQUIRE(n.requests.size() == 500);
    // Exactly N / rate, to the nanosecond the clock counts in.
    CHECK(n.requests.back().arrival == from_seconds(100.0));
    CAPTURE(proc);
    if (std::string(proc).find("poisson") != std::string::npos) {
      // The same draws, scaled: every arrival keeps its share of the span, and the lengths are the same.
      for (size_t i = 0; i < 500; i += 37) {
        CHECK(to_seconds(n.requests[i].arrival) == doctest::Approx(to_seconds(drawn.requests[i].arrival) * 100.0 / last));
        CHECK(n.requests[i].prompt_len == drawn.requests[i].prompt_len);
        CHECK(n.requests[i].max_output == drawn.requests[i].max_output);
      }
    }
    // Resolved back to YAML (tandem validate, a sweep's plan) with the key; default workloads without.
    CHECK(to_yaml(w).find("normalize: true") != std::string::npos);
  }
  CHECK(to_yaml(parse_workload(y, "w.yaml")).find("normalize") == std::string::npos);
  // Only the drawn processes have gaps to scale: a constant process refuses the key, naming it.
  std::string c = y;
  c.replace(c.find("{process: poisson, rate: 5}"), 27, "{process: constant, rate: 5, normalize: true}");
  CHECK(error_of(c).find("normalize") != std::string::npos);
  std::string b = y;
  b.replace(b.find("{process: poisson, rate: 5}"), 27, "{process: poisson, rate: 5, normalize: yes please}");
  CHECK(error_of(b).find("requests.arrival.normalize") != std::string::npos);
}

TEST_CASE("trace replay: azure across midnight, vidur, mooncake hash blocks, scaling and windows") {
  const std::string base = "model: llama3-8b\nhardware: h200\nrequests:\n  trace: {format: ";
  Workload w = parse_workload(base + "azure, path: ../traces/azure_sample.csv}\n", as_if_in_workloads_dir());
  RequestSet s = generate_requests(w);
  REQUIRE(s.requests.size() == 6);
  CHECK(s.requests[0].arrival == 0);
  CHECK(s.requests[3].arrival == from_seconds(2.25));  // 23:59:58.5 -> 00:00:00.75
  CHECK(s.requests[5].prompt_len == 2048);
  CHECK(s.requests[5].max_output == 300);

  w = parse_workload(base + "vidur, path: ../traces/vidur_sample.csv, rate_scale: 2, time_scale: 3}\n",
                     as_if_in_workloads_dir());
  s = generate_requests(w);
  REQUIRE(s.requests.size() == 4);
  CHECK(s.requests[3].arrival == from_seconds(2.25 * 3 / 2));

  w = parse_workload(base + "vidur, path: ../traces/vidur_sample.csv, start_s: 0.5, duration_s: 1, limit: 5}\n",
                     as_if_in_workloads_dir());
  s = generate_requests(w);
  REQUIRE(s.requests.size() == 2);  // rows at 0.5 and 0.75
  CHECK(s.requests[0].arrival == 0);
  CHECK(s.requests[1].arrival == from_seconds(0.25));

  w = parse_workload(base + "mooncake, path: ../traces/mooncake_sample.jsonl}\n", as_if_in_workloads_dir());
  s = generate_requests(w);
  REQUIRE(s.requests.size() == 4);
  CHECK(s.requests[2].arrival == from_seconds(3.0));
  CHECK(s.hash_block_size == 512);
  PromptTokens tok(0, w.model.vocab, s);
  // Requests 0 and 2 share hash ids 0 and 1: identical first 1024 tokens; block 2 differs (2 vs 4).
  for (int p = 0; p < 1024; p += 7) CHECK(tok.at(s.requests[0], p) == tok.at(s.requests[2], p));
  int same = 0;
  for (int p = 1024; p < 1100; ++p) same += tok.at(s.requests[0], p) == tok.at(s.requests[2], p);
  CHECK(same < 3);
  // Request 1 shares only hash id 0 with request 0.
  for (int p = 0; p < 512; p += 5) CHECK(tok.at(s.requests[0], p) == tok.at(s.requests[1], p));
}

TEST_CASE("bad trace rows name file, line and column") {
  const std::string dir = tandem::testing::source_path("tests/data/");
  auto err = [&](const std::string& fmt_, const std::string& file) {
    try {
      generate_requests(parse_workload(
          "model: llama3-8b\nhardware: h200\nrequests:\n  trace: {format: " + fmt_ + ", path: " + dir + file + "}\n",
          as_if_in_workloads_dir()));
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(err("azure", "bad_azure.csv").find("bad_azure.csv:3: column 'ContextTokens': expected a number, got 'abc'") !=
        std::string::npos);
  CHECK(err("vidur", "bad_azure.csv").find("missing column 'arrived_at'") != std::string::npos);
  CHECK(err("mooncake", "bad_mooncake.jsonl").find("bad_mooncake.jsonl:2: field 'output_length'") != std::string::npos);
  CHECK(err("azure", "does_not_exist.csv").find("cannot open") != std::string::npos);
}

// tandem serve --record-prompts: a vidur trace may give each prompt's token ids; they follow their
// request into arrival order and are its prompt (the engine serves them as a client's).
TEST_CASE("a vidur trace's prompt_token_ids are the prompts; bad ones name file, line and column") {
  const std::string dir = (std::filesystem::temp_directory_path() / fmt::format("tandem-ids-{}", ::getpid())).string();
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  auto load = [&](const std::string& path, const std::string& extra = "") {
    return generate_requests(parse_workload(
        "model: tiny\nhardware: h200\nrequests:\n  trace: {format: vidur, path: " + path + "}\n" + extra, "w.yaml"));
  };
  // Rows out of time order: the later one in the file arrives first and takes its ids along.
  const RequestSet s = load(write("ok.csv",
                                  "arrived_at,num_prefill_tokens,num_decode_tokens,prompt_token_ids\n"
                                  "0.5,3,4,7 8 9\n0.0,2,5,100 101\n"));
  REQUIRE(s.requests.size() == 2);
  REQUIRE(s.has_given_prompts());
  CHECK(s.requests[0].prompt_len == 2);
  CHECK(std::vector<Token>(s.given_prompt(s.requests[0]).begin(), s.given_prompt(s.requests[0]).end()) ==
        std::vector<Token>{100, 101});
  CHECK(std::vector<Token>(s.given_prompt(s.requests[1]).begin(), s.given_prompt(s.requests[1]).end()) ==
        std::vector<Token>{7, 8, 9});
  CHECK_FALSE(load(write("plain.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,3,4\n")).has_given_prompts());
  auto err = [&](const std::string& name, const std::string& rows, const std::string& extra = "") {
    try {
      load(write(name, "arrived_at,num_prefill_tokens,num_decode_tokens,prompt_token_ids\n" + rows), extra);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(err("count.csv", "0,3,4,7 8 9\n0,3,4,7 8\n")
            .find("count.csv:3: column 'prompt_token_ids': 2 token ids, but "
                  "num_prefill_tokens is 3") != std::string::npos);
  CHECK(err("word.csv", "0,2,4,7 x\n").find("word.csv:2: column 'prompt_token_ids': expected token ids") !=
        std::string::npos);
  CHECK(err("vocab.csv", "0,2,4,7 99999999\n")
            .find("vocab.csv:2: column 'prompt_token_ids': token id 99999999 is not "
                  "below the model's vocab") != std::string::npos);
  CHECK(err("shared.csv", "0,2,4,7 8\n", "  shared_prefix: {groups: 2, prefix_len: 4, fraction: 1}\n")
            .find("field 'requests.shared_prefix'") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("empirical lengths from one file are drawn as pairs") {
  std::string y =
      "model: llama3-8b\nhardware: h200\nrequests:\n  count: 300\n  arrival: {process: burst}\n"
      "  prompt_len: {dist: empirical, path: ../traces/lengths_sample.csv}\n"
      "  output_len: {dist: empirical, path: ../traces/lengths_sample.csv}\n";
  RequestSet s = generate_requests(parse_workload(y, as_if_in_workloads_dir()));
  int seen2000 = 0;
  for (const Request& r : s.requests) {
    CHECK(r.arrival == 0);
    CHECK(r.prompt_len == r.max_output * (r.prompt_len == 2000 ? 4 : 10));
    seen2000 += r.prompt_len == 2000;
  }
  CHECK(seen2000 > 50);
}

TEST_CASE("explicit cancellation beyond the last request is an input error") {
  std::string y = std::string(kBase) + "  cancel: {at: [{request: 10, at_s: 1}]}\n";
  CHECK_THROWS_AS(generate_requests(parse_workload(y, "w.yaml")), InputError);
}

TEST_CASE("timestamps") {
  double a = 0, b = 0;
  CHECK(parse_timestamp("2023-11-16 18:15:46.6810000", a));
  CHECK(parse_timestamp("2023-11-17 00:00:00", b));
  CHECK(b - a == doctest::Approx(5 * 3600 + 44 * 60 + 13.319).epsilon(1e-9));
  CHECK_FALSE(parse_timestamp("2023-13-01 00:00:00", a));
  CHECK_FALSE(parse_timestamp("2023-02-29 00:00:00", a));  // not a leap year
  CHECK_FALSE(parse_timestamp("2023-04-31 00:00:00", a));
  CHECK_FALSE(parse_timestamp("0000-01-01 00:00:00", a));
  CHECK(parse_timestamp("2024-02-29 12:00:00", a));
  CHECK_FALSE(parse_timestamp("yesterday", a));
  // Issue #11: sscanf alone took these; the seconds are digits, the fields one space apart.
  for (const char* bad : {"2023-11-16 18:15:nan", "2023-11-16 18:15:NAN", "2023-11-16 18:15:inf", "2023-11-16 18:15:+1",
                          "2023-11-16 18:15:-0", "2023-11-16 18:15:0x10", "2023-11-16 18:15:1e1",
                          "2023-11-16  18:15:46", " 2023-11-16 18:15:46", "+2023-11-16 18:15:46",
                          "2023-11-16 18:15:46.", "2023-11-16 18:15:46 ", "2023-11-16T18:15:46", ""})
    CHECK_FALSE(parse_timestamp(bad, a));
  CHECK(parse_timestamp("2023-1-6 8:5:6.25", a));
}

TEST_CASE("chunked prefill knobs: defaults, the resolved YAML round trip, and bad values naming the field") {
  Workload w = parse_workload(kBase, "w.yaml");
  CHECK(w.engine.enable_chunked_prefill);  // on by default, as in vLLM v1
  CHECK(w.engine.max_num_partial_prefills == 1);
  Workload off = parse_workload(kBase, "w.yaml",
                                {{"engine.enable_chunked_prefill", "false"}, {"engine.max_num_partial_prefills", "3"}});
  CHECK_FALSE(off.engine.enable_chunked_prefill);
  CHECK(off.engine.max_num_partial_prefills == 3);
  const Workload back = parse_workload(to_yaml(off), "resolved.yaml");
  CHECK_FALSE(back.engine.enable_chunked_prefill);
  CHECK(back.engine.max_num_partial_prefills == 3);
  // A chunk smaller than a block: refused with chunking on, fine with it off (stage 1).
  std::string e = error_of(std::string(kBase) + "engine:\n  max_num_batched_tokens: 8\n");
  CHECK_MESSAGE(e.find("w.yaml:10:") != std::string::npos, e);
  CHECK_MESSAGE(e.find("'engine.max_num_batched_tokens'") != std::string::npos, e);
  CHECK_MESSAGE(e.find("at least one block (16 tokens)") != std::string::npos, e);
  CHECK(
      error_of(std::string(kBase) + "engine:\n  max_num_batched_tokens: 8\n  enable_chunked_prefill: false\n").empty());
  e = error_of(kBase, {{"engine.block_size", "32"}, {"engine.max_num_batched_tokens", "31"}});
  CHECK_MESSAGE(e.find("engine.max_num_batched_tokens") != std::string::npos, e);
  e = error_of(std::string(kBase) + "engine:\n  max_num_partial_prefills: 0\n");
  CHECK_MESSAGE(e.find("'engine.max_num_partial_prefills'") != std::string::npos, e);
  e = error_of(kBase, {{"engine.enable_chunked_prefill", "maybe"}});
  CHECK_MESSAGE(e.find("engine.enable_chunked_prefill") != std::string::npos, e);
  CHECK(parse_workload(
            "model: llama3.1-8b\nhardware: h200\nrequests: {count: 1, arrival: {process: burst}, prompt_len: 100000, "
            "output_len: 10}\n",
            "w.yaml")
            .model.max_model_len == 131072);
}

TEST_CASE("presets: the papers' cards and models; a wrong name lists the known ones; a model's MLP round-trips") {
  for (const char* hw : {"a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "l40s"}) {
    CAPTURE(hw);
    const std::optional<HardwareSpec> h = hardware_preset(hw);
    REQUIRE(h);
    CHECK(h->source.find("datasheet") != std::string::npos);  // which numbers are the vendor's
    CHECK(h->source.find("assumed") != std::string::npos);    // which are assumed
  }
  // An A100-80GB holds 80 GB: llama2-13b at tp 1 leaves 80 x 0.9 - 26.03 GB for KV.
  const Workload a100 = parse_workload(kBase, "w.yaml", {{"model", "llama2-13b"}, {"hardware", "a100-80gb"}});
  const double weights = model_preset("llama2-13b")->weight_bytes();
  const double block = 16.0 * 2 * 40 * 40 * 128 * 2;  // tokens x K and V x layers x KV heads x head dim x fp16
  CHECK(a100.engine.resolved_kv_blocks == int32_t((80e9 * 0.9 - weights) / block));
  std::string e = error_of(kBase, {{"hardware", "a100"}});
  CHECK_MESSAGE(e.find("known: h200, h200-pcie, h200-datasheet, a100-40gb, a100-80gb, h100-sxm, h100-pcie, l40s") !=
                    std::string::npos,
                e);
  e = error_of(kBase, {{"model", "opt-1b"}});
  CHECK_MESSAGE(e.find("opt-13b, opt-66b, opt-175b") != std::string::npos, e);
  CHECK_MESSAGE(e.find("falcon-180b") != std::string::npos, e);
  // A preset's MLP and positions read back from the resolved YAML without the preset.
  const Workload opt = parse_workload(kBase, "w.yaml",
                                      {{"model", "opt-13b"}, {"hardware", "a100-80gb"}, {"requests.prompt_len", "100"}});
  const Workload back = parse_workload(to_yaml(opt), "resolved.yaml");
  CHECK(back.model.mlp == "relu");
  CHECK(back.model.positions == "learned");
  CHECK(back.model.tie_embeddings);
  CHECK(back.model.params() == opt.model.params());
  CHECK(to_yaml(a100).find("mlp:") == std::string::npos);  // Llama shapes print as before
  e = error_of(
      "seed: 1\nmodel: {preset: llama2-7b, mlp: geglu}\nhardware: h200\nrequests: {count: 1, arrival: {process: "
      "burst}, prompt_len: 10, output_len: 2}\n");
  CHECK_MESSAGE(e.find("'model.mlp'") != std::string::npos, e);
  CHECK_MESSAGE(e.find("known: swiglu") != std::string::npos, e);
}

TEST_CASE("channel link presets: a link gives the channel's bandwidth and latency; a wrong name lists them") {
  const std::string pd = std::string(kBase) + "disaggregation: {enabled: true, channel: {kind: sim, link: ib200}}\n";
  const Workload w = parse_workload(pd, "w.yaml");
  CHECK(w.disaggregation.channel.link == "ib200");
  CHECK(w.disaggregation.channel.bandwidth_gbs == 25);
  CHECK(w.disaggregation.channel.latency_us == 5);
  const Workload back = parse_workload(to_yaml(w), "resolved.yaml");
  CHECK(back.disaggregation.channel.bandwidth_gbs == 25);
  // A number given beside the link overrides it.
  const Workload faster = parse_workload(pd, "w.yaml", {{"disaggregation.channel.latency_us", "2"}});
  CHECK(faster.disaggregation.channel.latency_us == 2);
  CHECK(faster.disaggregation.channel.bandwidth_gbs == 25);
  for (const char* l : {"nvlink3", "nvlink4", "pcie4", "pcie5", "ib200", "ib400", "eth25", "eth100"})
    CHECK_MESSAGE(link_preset(l).has_value(), l);
  CHECK(link_preset("eth100")->bandwidth_gbs == 12.5);
  const std::string e = error_of(pd, {{"disaggregation.channel.link", "ib800"}});
  CHECK_MESSAGE(e.find("'disaggregation.channel.link'") != std::string::npos, e);
  CHECK_MESSAGE(e.find("known: nvlink3, nvlink4, pcie4, pcie5, ib200, ib400, eth25, eth100") != std::string::npos, e);
}

TEST_CASE("step composition: mixed by default, prompts_or_decodes reaches the scheduler and round-trips; bad input "
          "names the field") {
  const Workload w = parse_workload(kBase, "w.yaml");
  CHECK(w.engine.step_composition == StepComposition::Mixed);
  CHECK(to_yaml(w).find("step_composition") == std::string::npos);  // the default is not printed
  const Workload v0 = parse_workload(
      kBase, "w.yaml", {{"engine.enable_chunked_prefill", "false"}, {"engine.step_composition", "prompts_or_decodes"}});
  CHECK(v0.engine.step_composition == StepComposition::PromptsOrDecodes);
  CHECK(scheduler_config(v0).step_composition == StepComposition::PromptsOrDecodes);
  CHECK(parse_workload(to_yaml(v0), "resolved.yaml").engine.step_composition == StepComposition::PromptsOrDecodes);
  // Chunked prefill is on by default: the baseline is unchunked, and the error says so.
  std::string e = error_of(kBase, {{"engine.step_composition", "prompts_or_decodes"}});
  CHECK_MESSAGE(e.find("engine.step_composition") != std::string::npos, e);
  CHECK_MESSAGE(e.find("enable_chunked_prefill: false") != std::string::npos, e);
  e = error_of(std::string(kBase) + "engine:\n  enable_chunked_prefill: false\n  step_composition: orca\n");
  CHECK_MESSAGE(e.find("w.yaml:11:") != std::string::npos, e);
  CHECK_MESSAGE(e.find("'engine.step_composition'") != std::string::npos, e);
  CHECK_MESSAGE(e.find("known: mixed, prompts_or_decodes") != std::string::npos, e);
}

TEST_CASE("prefix caching knobs: on by default, the resolved YAML round trip, bad values naming the field") {
  Workload w = parse_workload(kBase, "w.yaml");
  CHECK(w.engine.enable_prefix_caching);  // on by default, as in vLLM v1
  CHECK(w.engine.block_size == 16);
  Workload off =
      parse_workload(kBase, "w.yaml", {{"engine.enable_prefix_caching", "false"}, {"engine.block_size", "32"}});
  CHECK_FALSE(off.engine.enable_prefix_caching);
  const Workload back = parse_workload(to_yaml(off), "resolved.yaml");
  CHECK_FALSE(back.engine.enable_prefix_caching);
  CHECK(back.engine.block_size == 32);
  std::string e = error_of(kBase, {{"engine.enable_prefix_caching", "sometimes"}});
  CHECK_MESSAGE(e.find("engine.enable_prefix_caching") != std::string::npos, e);
  e = error_of(std::string(kBase) + "engine:\n  enable_prefix_caching: 1.5\n");
  CHECK_MESSAGE(e.find("w.yaml:10:") != std::string::npos, e);
  CHECK_MESSAGE(e.find("'engine.enable_prefix_caching'") != std::string::npos, e);
  for (const char* bad : {"0", "-16", "1.5", "big", "70000"}) {
    e = error_of(kBase, {{"engine.block_size", bad}});
    CHECK_MESSAGE(e.find("engine.block_size") != std::string::npos, bad, ": ", e);
  }
  // shared_prefix.prepend puts the group prefix before the drawn prompt: prompt = prefix + drawn.
  const Workload p =
      parse_workload(std::string(kBase) + "  shared_prefix: {groups: 2, prefix_len: 64, prepend: true}\n", "w.yaml");
  CHECK(p.requests.shared_prefix.prepend);
  const RequestSet set = generate_requests(p);
  for (const Request& r : set.requests) {
    REQUIRE(r.prefix_group >= 0);
    CHECK(r.prefix_len == 64);
    CHECK(r.prompt_len == 164);
  }
  CHECK(parse_workload(to_yaml(p), "resolved.yaml").requests.shared_prefix.prepend);
  e = error_of(std::string(kBase) + "  shared_prefix: {groups: 2, prefix_len: 64, prepend: often}\n");
  CHECK_MESSAGE(e.find("'requests.shared_prefix.prepend'") != std::string::npos, e);
  e = error_of("seed: 1\nmodel: llama3-8b\nhardware: h200\nrequests:\n  trace: {format: mooncake, path: \"" +
               tandem::testing::source_path("traces/mooncake_sample.jsonl") +
               "\"}\n  shared_prefix: {groups: 1, prefix_len: 8, prepend: true}\n");
  CHECK_MESSAGE(e.find("'requests.shared_prefix.prepend'") != std::string::npos, e);
  CHECK_MESSAGE(e.find("mooncake") != std::string::npos, e);
}

// PromptTokens makes ids a run at a time (hoisted hash, no division) for prefix caching's
// hashing; every id must still be the documented formula: mix(mix(seed ^ source, key) ^ mix(offset)) % vocab.
TEST_CASE("prompt token ids: the run-at-a-time fill equals the per-position formula for every source") {
  RequestSet set;
  set.hash_block_size = 8;
  set.hash_ids = {11, 12, 99, 11};
  Request a;  // two Mooncake hash ids, then its own tokens
  a.id = 0;
  a.prompt_len = 40;
  a.hash_ids_begin = 0;
  a.hash_ids_count = 2;
  Request b = a;  // a shared-prefix group member
  b.id = 1;
  b.hash_ids_count = 0;
  b.prefix_group = 3;
  b.prefix_len = 21;
  Request c = a;  // hash ids first, a group after them
  c.id = 2;
  c.hash_ids_begin = 2;
  c.hash_ids_count = 2;
  c.prefix_group = 1;
  c.prefix_len = 30;
  set.requests = {a, b, c};
  for (int32_t vocab : {1, 7, 4096, 128256, 2147483647}) {
    const uint64_t seed = 12345;
    PromptTokens tok(seed, vocab, set);
    for (const Request& r : set.requests) {
      std::vector<Token> whole;
      tok.fill(r, whole);
      for (int32_t pos = 0; pos < r.prompt_len; ++pos) {
        uint64_t h;
        if (pos / 8 < int32_t(r.hash_ids_count))
          h = hash_combine(
              hash_combine(seed ^ 0x6d6f6f6eULL, uint64_t(set.hash_ids[r.hash_ids_begin + uint32_t(pos / 8)])),
              uint64_t(pos % 8));
        else if (r.prefix_group >= 0 && pos < r.prefix_len)
          h = hash_combine(hash_combine(seed ^ 0x67726f7570ULL, uint64_t(r.prefix_group)), uint64_t(pos));
        else
          h = hash_combine(hash_combine(seed ^ 0x72657175ULL, uint64_t(r.id)), uint64_t(pos));
        const auto want = static_cast<Token>(h % uint64_t(vocab));
        REQUIRE(tok.at(r, pos) == want);
        REQUIRE(whole[size_t(pos)] == want);
      }
      // Any window gives the same ids as the whole prompt.
      for (int32_t s0 = 0; s0 < r.prompt_len; s0 += 5) {
        const int32_t n = std::min(13, r.prompt_len - s0);
        std::vector<Token> part(static_cast<size_t>(n), 0);
        tok.fill(r, s0, n, part.data());
        CHECK(std::equal(part.begin(), part.end(), whole.begin() + s0));
      }
    }
    // Equal hash ids at the same offsets give equal ids (the Mooncake sharing rule).
    std::vector<Token> ta, tc;
    tok.fill(set.requests[0], ta);
    tok.fill(set.requests[2], tc);
    CHECK(std::equal(ta.begin(), ta.begin() + 8, tc.begin() + 8));
  }
}

// Prefix caching's block hashes: shared sources hashed and chained; from the first block with
// the request's own ids on, kPrivateBlock (nobody else can have them).
TEST_CASE("prompt block hashes: shared blocks chained, the request's own blocks private") {
  const Workload w = parse_workload(std::string(kBase) + "  shared_prefix: {groups: 1, prefix_len: 40}\n", "w.yaml",
                                    {{"requests.prompt_len", "100"}});
  const RequestSet set = generate_requests(w);
  const PromptTokens tok(w.seed, w.model.vocab, set);
  const BlockHash root = root_block_hash(w);
  std::vector<BlockHash> a, b;
  hash_prompt_blocks(set.requests[0], tok, 16, root, a);
  hash_prompt_blocks(set.requests[1], tok, 16, root, b);
  REQUIRE(a.size() == 6);  // 100 / 16 full blocks
  // Blocks 0 and 1 lie inside the 40-token group prefix: equal across members, chained (distinct).
  CHECK(a[0] == b[0]);
  CHECK(a[1] == b[1]);
  CHECK_FALSE(a[0] == a[1]);
  CHECK_FALSE(a[0] == kPrivateBlock);
  // Block 2 (tokens 32-47) holds the prefix's end and the request's own ids: private from there.
  for (size_t i = 2; i < a.size(); ++i) CHECK(a[i] == kPrivateBlock);
  // Another model (root) names the same tokens differently.
  Workload w2 = w;
  w2.model.name = "other";
  std::vector<BlockHash> c;
  hash_prompt_blocks(set.requests[0], tok, 16, root_block_hash(w2), c);
  CHECK_FALSE(c[0] == a[0]);
}

TEST_CASE("disaggregation.channel.table: measured times by size, checked, round-tripped, exclusive with a line") {
  const std::string pd = std::string(kBase) + "disaggregation: {enabled: true, channel: {kind: copy, table: ";
  const Workload w = parse_workload(pd + "[[65536, 2.5e-6], [131072, 5e-6], [4194304, 7.5e-4]]}}\n", "w.yaml");
  REQUIRE(w.disaggregation.channel.table.size() == 3);
  CHECK(w.disaggregation.channel.table[2] == ChannelPoint{4194304, 7.5e-4});
  const std::string resolved = to_yaml(w);
  CHECK(resolved.find("table: [[65536, 2.5e-06], [131072, 5e-06], [4194304, 0.00075]]") != std::string::npos);
  CHECK(resolved.find("    bandwidth_gbs") == std::string::npos);  // not used with a table: not printed
  CHECK(parse_workload(resolved, "resolved.yaml").disaggregation.channel.table == w.disaggregation.channel.table);
  CHECK(error_of(pd + "[[131072, 5e-6], [65536, 2.5e-6]]}}\n")
            .find("field 'disaggregation.channel.table[1]': bytes must increase (65536 after 131072)") !=
        std::string::npos);
  CHECK(error_of(pd + "[[65536, 5e-6], [131072, 2.5e-6]]}}\n").find("seconds must not decrease") != std::string::npos);
  CHECK(error_of(pd + "[[65536]]}}\n").find("a [bytes, seconds] pair") != std::string::npos);
  CHECK(error_of(pd + "[]}}\n").find("at least one") != std::string::npos);
  CHECK(error_of(pd + "[[65536, 2.5e-6]], bandwidth_gbs: 3}}\n").find("give a table or bandwidth_gbs/latency_us") !=
        std::string::npos);
}
