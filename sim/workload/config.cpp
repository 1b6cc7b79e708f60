// What follows from a parsed workload (config.h): the KV cache's capacity and how it was
// derived, the scheduler's knobs, the serving instances. Reading a workload file is
// config_workload.cpp's.
#include "sim/workload/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

namespace tandem {

KvCapacity kv_capacity(const ModelSpec& m, const HardwareSpec& hw, const EngineSpec& e) {
  KvCapacity c;
  c.tp = e.tp;
  c.block_size = e.block_size;
  c.linear_bytes = m.linear_params() * m.dtype_bytes();
  c.embedding_bytes = m.embedding_params() * m.dtype_bytes();
  c.block_bytes_per_gpu = double(e.block_size) * m.kv_bytes_per_token(m.dtype_bytes(), e.tp);
  if (e.num_kv_blocks > 0) {
    c.source = KvCapacity::Source::Blocks;
    c.blocks = double(e.num_kv_blocks);
    return c;
  }
  if (e.kv_memory_gb > 0) {
    c.source = KvCapacity::Source::KvMemory;
    c.kv_bytes_per_gpu = e.kv_memory_gb * 1e9;
  } else {
    c.memory_per_gpu = hw.memory_bytes;
    c.utilization = e.gpu_memory_utilization;
    c.weight_bytes_per_gpu = m.weight_bytes_per_rank(e.tp);
    c.kv_bytes_per_gpu = hw.memory_bytes * e.gpu_memory_utilization - c.weight_bytes_per_gpu;
  }
  c.blocks = c.kv_bytes_per_gpu > 0 ? std::floor(c.kv_bytes_per_gpu / c.block_bytes_per_gpu) : 0;
  return c;
}

std::string KvCapacity::text() const {
  const auto gb = [](double b) {
    return b >= 1e9 ? fmt::format("{:.2f} GB", b / 1e9) : fmt::format("{:.2f} MB", b / 1e6);
  };
  const std::string ranks = tp == 1 ? "" : " per GPU";
  const std::string all =
      tp == 1 ? "" : fmt::format("; {} ranks: {} in all", tp, gb(blocks * block_bytes_per_gpu * tp));
  const std::string per_block =
      fmt::format("{:.0f} bytes per block{} ({} tokens)", block_bytes_per_gpu, ranks, block_size);
  switch (source) {
    case Source::Blocks:
      return fmt::format("num_kv_blocks as given: {:.0f} blocks x {} = {}{}{}", blocks, per_block,
                         gb(blocks * block_bytes_per_gpu), ranks, all);
    case Source::KvMemory:
      return fmt::format("engine.kv_memory_gb {}{} / {} = {:.0f} blocks{}", gb(kv_bytes_per_gpu), ranks, per_block,
                         blocks, all);
    case Source::DeviceMemory: break;
  }
  const std::string weights =
      tp == 1 ? fmt::format("{} weights", gb(weight_bytes_per_gpu))
              : fmt::format("({} linear weights / {} ranks + {} embedding and LM head, whole on each rank)",
                            gb(linear_bytes), tp, gb(embedding_bytes));
  return fmt::format("{:.6g} GB x {:.6g} - {} = {}{} / {} = {:.0f} blocks{}", memory_per_gpu / 1e9, utilization,
                     weights, gb(kv_bytes_per_gpu), ranks, per_block, blocks, all);
}

SchedulerConfig scheduler_config(const Workload& w) {
  return {.policy = w.engine.policy,
          .max_num_seqs = w.engine.max_num_seqs,
          .max_num_batched_tokens = w.engine.max_num_batched_tokens,
          .max_model_len = w.model.max_model_len,
          .enable_chunked_prefill = w.engine.enable_chunked_prefill,
          .max_num_partial_prefills = w.engine.max_num_partial_prefills,
          .step_composition = w.engine.step_composition,
          .enable_prefix_caching = w.engine.enable_prefix_caching};
}

std::vector<InstanceSpec> instance_specs(const Workload& w) {
  std::vector<InstanceSpec> out;
  const auto with = [&](const InstanceOverrides& o) {
    EngineSpec e = w.engine;
    if (o.max_num_seqs) e.max_num_seqs = *o.max_num_seqs;
    if (o.max_num_batched_tokens) e.max_num_batched_tokens = *o.max_num_batched_tokens;
    if (o.max_num_partial_prefills) e.max_num_partial_prefills = *o.max_num_partial_prefills;
    if (o.tp) e.tp = *o.tp;
    if (o.device) e.device = *o.device;
    if (o.resolved_kv_blocks > 0) {
      e.resolved_kv_blocks = o.resolved_kv_blocks;
      e.kv_derivation = o.kv_derivation;
    } else if (o.num_kv_blocks) {
      e.resolved_kv_blocks = *o.num_kv_blocks;
    }
    return e;
  };
  const auto add = [&](InstanceRole role, const EngineSpec& e, const std::optional<HardwareSpec>& own) {
    Workload one = w;
    one.engine = e;
    SchedulerConfig c = scheduler_config(one);
    c.role = role;
    // The decode instance computes no prompt: nothing to hash, nothing to hit.
    if (role == InstanceRole::Decode) c.enable_prefix_caching = false;
    out.push_back({int32_t(out.size()), role, e, c, own ? *own : w.hardware});
  };
  if (w.disaggregation.enabled) {
    add(InstanceRole::Prefill, with(w.disaggregation.prefill), w.disaggregation.prefill.hardware);
    add(InstanceRole::Decode, with(w.disaggregation.decode), w.disaggregation.decode.hardware);
  } else {
    for (int32_t i = 0; i < w.engine.data_parallel; ++i) add(InstanceRole::Colocated, w.engine, std::nullopt);
  }
  return out;
}

Workload instance_workload(const Workload& w, const InstanceSpec& in) {
  Workload one = w;
  one.engine = in.engine;
  one.hardware = in.hardware;
  return one;
}

}  // namespace tandem
