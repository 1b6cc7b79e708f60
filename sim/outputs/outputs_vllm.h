// vllm_result.json: the file `vllm bench serve --save-result` writes, as vLLM v0.34.0 writes it
// (vllm/benchmarks/serve.py: main_async's result_json, into which benchmark()'s result is merged),
// so that scripts written for vLLM's results read tandem's simulated and measured runs alike.
// Keys, their order, units and statistics are vLLM's; README.md ("Outputs") gives the mapping.
//
// Memory: the per-request inter-token latencies are per token. Only the requests in flight keep
// their token times in memory; a finished request's go to a scratch file (unlinked as soon as it
// is opened, so nothing is left behind) and are read back, one request at a time, when the file
// is written. The ITL median and p99 are exact (numpy's) all the same: a histogram of every gap,
// kept as the requests finish, names the bucket that holds each wanted rank, and the read-back
// keeps only the values in those buckets.
#pragma once
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/request.h"
#include "sim/workload/config.h"
#include "sim/engine/instance.h"
#include "sim/engine/metrics.h"

namespace tandem {

class Engine;

// The vLLM release whose format vllm_result.json matches.
inline constexpr const char* kVllmResultVersion = "0.34.0";

// The GPU-count keys of a vLLM record, from a run's layout (summary.json's `layout` object), for
// `tandem run`'s vllm_result.json and the sweep's vLLM layout alike. vLLM's plot_pareto divides a
// throughput by tensor_parallel_size x data_parallel_size, or by the key --gpu-count-var names.
// num_gpus: the layout's GPUs (nullopt where the layout is unknown; 0 on the CPU backend).
// tensor_parallel_size and data_parallel_size: only for colocated replicas of one TP whose product
// is those GPUs; a 1P1D layout has num_gpus alone (P's GPUs + D's are no TP x DP product).
struct VllmGpuKeys {
  std::optional<int64_t> num_gpus, tensor_parallel_size, data_parallel_size;
};
VllmGpuKeys vllm_gpu_keys(const nlohmann::json& layout);

class VllmResult {
 public:
  // `detailed`: also the per-request arrays that vLLM keeps only with --save-detailed
  // (input_lens, output_lens, ttfts, itls, start_times, generated_texts, errors). Opens the
  // scratch file in `dir`; throws InputError when it cannot.
  VllmResult(const std::string& dir, bool detailed);
  ~VllmResult();
  VllmResult(const VllmResult&) = delete;
  VllmResult& operator=(const VllmResult&) = delete;

  // A step is done: each sequence that sampled got a token at r.tokens_at.
  void on_step(const StepRecord& r);
  // A request left the run: a finished one's token times go to the scratch file, any other's
  // are dropped (vLLM counts it as failed, with no ITLs).
  void on_request_done(const Request& r);
  // Writes DIR/vllm_result.json; false if a write failed.
  bool write(const Engine& e, const Summary& s, const Workload& w);

 private:
  std::string dir_;
  bool detailed_;
  std::FILE* scratch_ = nullptr;
  uint64_t scratch_len_ = 0;  // bytes
  bool failed_ = false;
  std::vector<std::vector<Time>> in_flight_;  // by request id: its token times so far
  std::vector<uint64_t> offset_;              // by request id: where its token times are in the scratch file
  std::vector<int32_t> num_tokens_;           // by request id: how many; -1: not there
  // Every inter-token gap of the finished requests (ns): counts per bucket, their number and sum.
  std::vector<int64_t> itl_buckets_;
  int64_t num_itls_ = 0;
  long double itl_sum_s_ = 0;

  void make_room(ReqId id);
  // `first_token`: the client's first token (Request::first_token), which replaces the first
  // step's time (1P1D with first_token_from: decode: the transfer's end, not P's step).
  void spill(ReqId id, Time first_token);
  bool read_tokens(ReqId id, std::vector<Time>& out);
};

}  // namespace tandem
