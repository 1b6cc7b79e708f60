// A workload file, resolved: every field has a value, either from the file, a --set
// override, or a documented default. Parsing errors name file:line:column and the field.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "backend/specs.h"
#include "backend/transfer/channel.h"
#include "core/error.h"
#include "policies/scheduler.h"

namespace tandem {

// A length (or delay) distribution. Values are rounded to integers where lengths are drawn.
struct DistSpec {
  enum class Kind { Fixed, Uniform, Lognormal, Mixture, Empirical } kind = Kind::Fixed;
  double value = 0;              // fixed
  double min = 1, max = 1e18;    // uniform bounds; clamps for lognormal
  double median = 0, sigma = 0;  // lognormal (median = e^mu)
  struct Component;
  std::vector<Component> components;  // mixture (weights need not sum to 1)
  std::string path, column;           // empirical: a CSV file and the column to draw from
  std::vector<double> samples;        // empirical: loaded values
};

struct DistSpec::Component {
  double weight = 1;
  DistSpec dist;
};

struct ArrivalSpec {
  enum class Kind { Poisson, Gamma, Constant, Burst } kind = Kind::Poisson;
  double rate = 1.0;       // requests per second (poisson, gamma, constant)
  double cv = 1.0;         // gamma: coefficient of variation of inter-arrival times
  int64_t burst_size = 0;  // burst: requests per burst (0: all at once)
  double interval_s = 0;   // burst: time between bursts
  // poisson, gamma: scale the drawn gaps so that the last of `count` arrivals is at count / rate,
  // as vLLM's `bench serve` does (its offered rate is then exactly `rate`); off, the drawn gaps
  // as they are (the offered rate is a draw, a few % from `rate`).
  bool normalize = false;
};

struct SharedPrefixSpec {
  int32_t groups = 0;     // 0: off
  DistSpec prefix_len;    // leading tokens shared by a group (capped at the prompt length)
  double fraction = 1.0;  // share of requests that belong to some group
  // false: the prefix is the leading part of the drawn prompt (capped at its length);
  // true: the prefix is put before the drawn prompt (a system prompt + a user turn), so a
  // member's prompt_len is prefix_len + the drawn length.
  bool prepend = false;
};

// prefill: its first step on the prefill instance is planned; parked: its first token is out,
// it waits for the decode instance; transfer: its KV transfer started (before any answer);
// received: its KV is on the decode instance, before a step there; decode: after that step.
inline constexpr const char* kCancelPhases[] = {"prefill", "parked", "transfer", "received", "decode"};

struct CancelSpec {
  struct At {
    int64_t request;
    double at_s;
  };
  std::vector<At> explicit_cancels;  // request index (arrival order) and absolute time
  // 1P1D: a request cancelled the moment it reaches a point of its handoff, under any clock (the
  // lifecycle tests' placements, over a real channel too): kCancelPhases.
  struct AtPhase {
    int64_t request;
    std::string phase;
  };
  std::vector<AtPhase> phase_cancels;
  double fraction = 0;               // or: this share of requests, cancelled after a delay
  DistSpec after_s;                  // delay after arrival, seconds
};

struct TraceSpec {
  enum class Format { Azure, Mooncake, Vidur } format = Format::Azure;
  std::string path;
  double time_scale = 1.0;        // multiplies every arrival offset
  double rate_scale = 1.0;        // divides every arrival offset (2 = twice the request rate)
  double start_s = 0;             // skip requests before this offset
  double duration_s = 0;          // 0: to the end
  int64_t limit = 0;              // 0: all rows
  int32_t hash_block_size = 512;  // Mooncake: tokens per hash id
};

struct RequestsSpec {
  std::optional<TraceSpec> trace;  // trace replay, or the synthetic generator below
  int64_t count = 0;
  ArrivalSpec arrival;
  DistSpec prompt_len, output_len;
  SharedPrefixSpec shared_prefix;
  CancelSpec cancel;
};

// The scheduler's knobs take their defaults from SchedulerConfig (policies/scheduler.h) and the
// block size from kDefaultBlockSize (policies/kv_cache.h): one source for every default.
struct EngineSpec {
  BatchingPolicy policy = SchedulerConfig{}.policy;
  int32_t max_num_seqs = SchedulerConfig{}.max_num_seqs;
  int32_t max_num_batched_tokens = SchedulerConfig{}.max_num_batched_tokens;      // per-step token budget
  bool enable_chunked_prefill = SchedulerConfig{}.enable_chunked_prefill;         // stage 2 (false: stage 1)
  int32_t max_num_partial_prefills = SchedulerConfig{}.max_num_partial_prefills;  // prompts part-way at once
  StepComposition step_composition = SchedulerConfig{}.step_composition;          // stage 1: mixed, or prompts_or_decodes
  bool enable_prefix_caching = SchedulerConfig{}.enable_prefix_caching;           // stage 3 (false: stage 2)
  int32_t block_size = kDefaultBlockSize;
  int64_t num_kv_blocks = 0;              // 0: derived from kv_memory_gb or device memory
  double kv_memory_gb = 0;                // per GPU (each rank's share of the cache); 0: derived from device memory
  double gpu_memory_utilization = 0.9;    // share of device memory for weights + KV
  int32_t state_slots = -1;               // hybrid models: per-sequence state slots; -1: none
  std::string prefix_caching_off_reason;  // set when caching was turned off by a rule (state_slots)
  bool deterministic = true;              // real backends: batch/chunk-invariant kernels (golden-exact)
  int32_t tp = 1;                         // tensor parallelism: ranks the model is split over
  bool cuda_graph = true;                 // CUDA backend: decode steps replay captured graphs
  std::string cuda_attention = "simt";    // CUDA backend: simt, mma (tensor cores), split, mma_split (split-KV)
  std::string cuda_row_kernels = "v1";    // CUDA backend: RMSNorm/RoPE v1, or v2 (loads first; the same bits)
  std::string cuda_gemm = "pinned";       // CUDA backend: pinned cuBLASLt algorithms, or own (tensor-core GEMM)
  int32_t data_parallel = 1;              // colocated instances, arrivals split round-robin (each its own cache)
  int32_t device = 0;                     // CUDA: the instance's first GPU (set per instance by disaggregation)
  int32_t resolved_kv_blocks = 0;         // what the run uses (set by resolve)
  std::string kv_derivation;              // how resolved_kv_blocks follows from the inputs (KvCapacity::text)
};

// How a serving instance's KV cache size follows from its model, hardware and engine section:
// num_kv_blocks as given; or kv_memory_gb; or what each GPU's memory leaves after its share of
// the weights. Memory is per GPU: each of the instance's tp ranks holds its share of the weights
// (ModelSpec::weight_bytes_per_rank: linear weights / tp, embedding and LM head whole) and of
// every block (its KV heads: block bytes / tp), so
//   blocks = floor(kv_bytes_per_gpu / (block_bytes / tp))
//   kv_bytes_per_gpu = hardware.memory_gb x gpu_memory_utilization - weights per rank, or kv_memory_gb
// and the instance's cache is tp x kv_bytes_per_gpu. At tp 1: memory x utilization - weights.
struct KvCapacity {
  enum class Source { Blocks, KvMemory, DeviceMemory } source = Source::DeviceMemory;
  int32_t tp = 1, block_size = 0;
  double memory_per_gpu = 0, utilization = 0;    // DeviceMemory: hardware.memory_gb (bytes), gpu_memory_utilization
  double linear_bytes = 0, embedding_bytes = 0;  // the whole model's (for the text)
  double weight_bytes_per_gpu = 0;               // DeviceMemory: what one rank holds
  double kv_bytes_per_gpu = 0;                   // KvMemory, DeviceMemory: the budget (<= 0: no room)
  double block_bytes_per_gpu = 0;                // one block's K and V on one rank
  double blocks = 0;                             // as given, or the floor above; not yet range-checked
  // The arithmetic in one line, e.g. "141 GB x 0.9 - (13.96 GB linear weights / 2 ranks + 2.10 GB
  // embedding and LM head, whole on each rank) = 117.82 GB per GPU / 1048576 bytes per block per
  // GPU (16 tokens) = 112361 blocks; 2 ranks: 235.64 GB in all".
  std::string text() const;
};
KvCapacity kv_capacity(const ModelSpec& m, const HardwareSpec& hw, const EngineSpec& e);

// Stage 4: one prefill and one decode instance, the KV moved between them by a channel.
struct InstanceOverrides {  // per instance, over the engine section (unset: the engine's value)
  std::optional<int32_t> max_num_seqs, max_num_batched_tokens, max_num_partial_prefills, tp, device;
  std::optional<int32_t> num_kv_blocks;
  // The instance's own hardware (a preset, a mapping over the workload's hardware, or a profile):
  // its cost model prices the instance's steps, its memory sizes the instance's cache, its link
  // carries the instance's TP all-reduces. The link between prefill and decode is the channel's.
  std::optional<HardwareSpec> hardware;
  // Set by parse_workload when the instance's tp, hardware or num_kv_blocks gives it a cache of
  // its own (kv_capacity on its GPUs); 0: the engine's resolved_kv_blocks.
  int32_t resolved_kv_blocks = 0;
  std::string kv_derivation;
};
struct ChannelSpec {
  std::string kind = "copy";    // sim (modelled only), copy (one process), tcp (two processes), nccl (two GPUs)
  double bandwidth_gbs = 25;    // GB/s: how the simulated backend prices a transfer (any kind)
  double latency_us = 20;       // per transfer
  bool layerwise = false;       // sim pricing: layers leave as the last prefill step computes them
  double timeout_ms = 30000;    // a transfer or a worker reply that takes longer fails the request
  std::string peer;             // tcp: HOST:PORT of a `tandem worker` already listening; empty: start one
  std::string secret_file;      // tcp: shared secret both sides prove (required off loopback)
  std::string profile;          // a measured channel (tandem calibrate --channel): its table, or bandwidth and latency
  std::string link;             // a link preset (backend/specs.h LinkPreset) that gave bandwidth_gbs and latency_us
  // Measured transfer times by size (ChannelModel::table): given, the simulated backend prices a
  // transfer by it instead of latency + bytes / bandwidth.
  std::vector<ChannelPoint> table;
};
// Which first token the client sees in 1P1D, and so what TTFT, TPOT, ITL and the SLO count.
// Prefill: the token P samples, streamed from P at once (the transfer then sits in the first
// inter-token gap). Decode: the client is served by D alone, which streams that token when it
// holds the request's KV (the transfer's end); TPOT and ITL are counted from there.
enum class FirstTokenFrom : uint8_t { Prefill, Decode };
std::string_view to_string(FirstTokenFrom f);
struct DisaggregationSpec {
  bool enabled = false;  // false: stage 3 exactly (one colocated instance)
  InstanceOverrides prefill, decode;
  ChannelSpec channel;
  FirstTokenFrom first_token_from = FirstTokenFrom::Prefill;
};

struct SloSpec {
  double ttft_ms = 0;  // 0: no bound
  double tpot_ms = 0;
  bool any() const { return ttft_ms > 0 || tpot_ms > 0; }
};

struct Workload {
  std::string path;  // the file it came from
  std::string name;
  uint64_t seed = 0;
  ModelSpec model;
  HardwareSpec hardware;
  EngineSpec engine;
  RequestsSpec requests;
  SloSpec slo;
  DisaggregationSpec disaggregation;
};

struct Override {
  std::string key, value;
};
// The --set options of a command: each KEY=VALUE (InputError naming the option otherwise).
std::vector<Override> parse_sets(const std::vector<std::string>& sets);

// Parse and check a workload file, applying `--set key=value` overrides first.
// Throws InputError with file:line:column and the field.
Workload load_workload(const std::string& path, const std::vector<Override>& overrides = {});
Workload parse_workload(const std::string& yaml_text, const std::string& path,
                        const std::vector<Override>& overrides = {});
// The resolved configuration as YAML (what `tandem validate` prints).
std::string to_yaml(const Workload& w);
// The scheduler's knobs of a workload (the engine section and the model's max_model_len).
SchedulerConfig scheduler_config(const Workload& w);

// The serving instances of a run: one colocated (stage 1-3), engine.data_parallel colocated
// replicas, or a prefill and a decode instance (disaggregation.enabled), each with its engine
// section (the workload's, with the instance's overrides) and its scheduler's knobs.
struct InstanceSpec {
  int32_t id = 0;
  InstanceRole role = InstanceRole::Colocated;
  EngineSpec engine;
  SchedulerConfig scheduler;
  HardwareSpec hardware;  // the workload's, or the instance's own (disaggregation.prefill/decode.hardware)
};
std::vector<InstanceSpec> instance_specs(const Workload& w);
// The workload one instance runs: the same, with that instance's engine section and hardware.
// What builds an executor (sim/run/executors.h) takes a Workload; this gives it the instance's.
Workload instance_workload(const Workload& w, const InstanceSpec& in);

}  // namespace tandem
