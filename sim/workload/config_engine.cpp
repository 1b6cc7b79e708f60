// The workload's engine section: batching policy, batch limits, KV cache sizing inputs and
// the real backends' switches, and its resolved YAML. The section may be left out entirely
// (all defaults); the KV cache size itself is resolved in config.cpp, once the model and
// hardware are known.
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "sim/workload/config_sections.h"

namespace tandem::config_detail {

EngineSpec parse_engine(const Field& f) {
  EngineSpec e;
  if (!f.present()) return e;
  f.expect_map({"policy", "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
                "max_num_partial_prefills", "enable_prefix_caching", "block_size", "num_kv_blocks", "kv_memory_gb",
                "gpu_memory_utilization", "state_slots", "deterministic", "tp", "cuda_graph", "cuda_attention",
                "cuda_row_kernels", "cuda_gemm", "data_parallel", "step_composition"});
  const std::string pol = f.get_string("policy", "continuous");
  if (pol == "continuous")
    e.policy = BatchingPolicy::Continuous;
  else if (pol == "static")
    e.policy = BatchingPolicy::Static;
  else
    f["policy"].fail(fmt::format("unknown policy '{}' (known: static, continuous)", pol));
  e.max_num_seqs = int32_t(f.get_int("max_num_seqs", e.max_num_seqs, 1, 1 << 20));
  e.max_num_batched_tokens = int32_t(f.get_int("max_num_batched_tokens", e.max_num_batched_tokens, 1, kI32Max));
  e.block_size = int32_t(f.get_int("block_size", e.block_size, 1, 1 << 16));
  if (f.has("enable_chunked_prefill")) e.enable_chunked_prefill = f["enable_chunked_prefill"].as_bool();
  e.max_num_partial_prefills = int32_t(f.get_int("max_num_partial_prefills", e.max_num_partial_prefills, 1, 1 << 20));
  if (f.has("enable_prefix_caching")) e.enable_prefix_caching = f["enable_prefix_caching"].as_bool();
  const std::string comp = f.get_string("step_composition", std::string(to_string(e.step_composition)));
  if (comp == "mixed")
    e.step_composition = StepComposition::Mixed;
  else if (comp == "prompts_or_decodes")
    e.step_composition = StepComposition::PromptsOrDecodes;
  else
    f["step_composition"].fail(fmt::format("unknown step composition '{}' (known: mixed, prompts_or_decodes)", comp));
  // vLLM v0 itself mixed decodes into chunked steps: the prompts-or-decodes baseline is unchunked.
  if (e.step_composition == StepComposition::PromptsOrDecodes && e.enable_chunked_prefill)
    f["step_composition"].fail(
        "prompts_or_decodes (a step runs waiting prompts or decodes, never both) is a stage 1 baseline: it needs "
        "engine.enable_chunked_prefill: false");
  // A chunk shorter than a block would make every prompt crawl a few tokens a step: refused.
  if (e.enable_chunked_prefill && e.max_num_batched_tokens < e.block_size)
    f[f.has("max_num_batched_tokens") ? "max_num_batched_tokens" : "block_size"].fail(fmt::format(
        "with chunked prefill the token budget ({}) is the chunk size and must be at least one block ({} tokens)",
        e.max_num_batched_tokens, e.block_size));
  // Two ways to size the cache: one given with --set replaces the file's other.
  const Field kv = f.prefer_overrides({{"num_kv_blocks"}, {"kv_memory_gb"}});
  e.num_kv_blocks = kv.get_int("num_kv_blocks", 0, 1, kI32Max);
  e.kv_memory_gb = kv.get_double("kv_memory_gb", 0, 1e-9, 1e9);
  e.gpu_memory_utilization = f.get_double("gpu_memory_utilization", e.gpu_memory_utilization, 0.01, 1.0);
  e.state_slots = int32_t(f.get_int("state_slots", -1, 0, kI32Max));
  // Plain prefix caching shares KV blocks only: a model with per-sequence (recurrent) state has
  // no state for the prefix a hit skips, so its output would change (vLLM refuses the same).
  // Asked for: refused; left at its default: off, and the run says why.
  if (e.state_slots >= 0 && e.enable_prefix_caching) {
    if (f.has("enable_prefix_caching"))
      f["enable_prefix_caching"].fail(
          "a model with per-sequence state (engine.state_slots) cannot take prefix hits: no "
          "recurrent state exists for the prefix a hit skips; set it to false");
    e.enable_prefix_caching = false;
    e.prefix_caching_off_reason =
        "the model has per-sequence state (engine.state_slots), which a prefix hit cannot restore";
  }
  if (f.has("deterministic")) e.deterministic = f["deterministic"].as_bool();
  if (f.has("cuda_graph")) e.cuda_graph = f["cuda_graph"].as_bool();
  e.cuda_attention = f.get_string("cuda_attention", e.cuda_attention);
  if (e.cuda_attention != "simt" && e.cuda_attention != "mma" && e.cuda_attention != "split" &&
      e.cuda_attention != "mma_split")
    f["cuda_attention"].fail(
        fmt::format("unknown attention kernel '{}' (known: simt, mma, split, mma_split)", e.cuda_attention));
  e.cuda_gemm = f.get_string("cuda_gemm", e.cuda_gemm);
  if (e.cuda_gemm != "pinned" && e.cuda_gemm != "own")
    f["cuda_gemm"].fail(fmt::format("unknown GEMM choice '{}' (known: pinned, own)", e.cuda_gemm));
  e.cuda_row_kernels = f.get_string("cuda_row_kernels", e.cuda_row_kernels);
  if (e.cuda_row_kernels != "v1" && e.cuda_row_kernels != "v2")
    f["cuda_row_kernels"].fail(
        fmt::format("unknown RMSNorm/RoPE kernel version '{}' (known: v1, v2)", e.cuda_row_kernels));
  e.tp = int32_t(f.get_int("tp", 1, 1, 1024));
  e.data_parallel = int32_t(f.get_int("data_parallel", 1, 1, 64));
  if (kv.has("num_kv_blocks") && kv.has("kv_memory_gb"))
    kv["kv_memory_gb"].fail(fmt::format(
        "give num_kv_blocks or kv_memory_gb, not both (both {}; one given with --set replaces the file's other)",
        kv["kv_memory_gb"].from_override() ? "with --set" : "in the file"));
  return e;
}

// The cache is printed as the resolved block count (not kv_memory_gb), so the output reads
// back to the same cache whatever the hardware's memory.
YAML::Node engine_yaml(const EngineSpec& e) {
  YAML::Node n;
  n["policy"] = std::string(to_string(e.policy));
  n["max_num_seqs"] = e.max_num_seqs;
  n["max_num_batched_tokens"] = e.max_num_batched_tokens;
  n["enable_chunked_prefill"] = e.enable_chunked_prefill;
  n["max_num_partial_prefills"] = e.max_num_partial_prefills;
  // Absent at mixed (the default): stage 1-4 files read and print as before.
  if (e.step_composition != StepComposition::Mixed) n["step_composition"] = std::string(to_string(e.step_composition));
  n["enable_prefix_caching"] = e.enable_prefix_caching;
  n["block_size"] = e.block_size;
  n["num_kv_blocks"] = e.resolved_kv_blocks;
  n["gpu_memory_utilization"] = yaml_number(e.gpu_memory_utilization);
  if (e.state_slots >= 0) n["state_slots"] = e.state_slots;
  n["deterministic"] = e.deterministic;
  n["cuda_graph"] = e.cuda_graph;
  n["cuda_attention"] = e.cuda_attention;
  if (e.cuda_row_kernels != "v1") n["cuda_row_kernels"] = e.cuda_row_kernels;  // absent at v1: files unchanged
  if (e.cuda_gemm != "pinned") n["cuda_gemm"] = e.cuda_gemm;                   // absent at pinned: the same
  n["tp"] = e.tp;
  if (e.data_parallel != 1) n["data_parallel"] = e.data_parallel;  // absent at 1: stage 1-3 files unchanged
  return n;
}

}  // namespace tandem::config_detail
