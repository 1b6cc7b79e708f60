// A sweep's results in the layout of vLLM's own parameter sweep (`vllm bench sweep serve`), so
// that `vllm bench sweep plot` and `plot_pareto` read a tandem sweep as they read theirs.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "sim/sweep/sweep_file.h"

namespace tandem {

// vLLM's record of one benchmark run (its `vllm bench serve --save-result` keys that the sweep
// plots read), from one of a point's runs: request_rate, throughputs, mean/median/p90/p99 of
// ttft/tpot/itl/e2el in ms, completed and failed, plus the point's parameters under their tandem
// keys, num_gpus, and tensor_parallel_size / data_parallel_size where the layout is colocated
// replicas (their product is then its GPUs; a 1P1D point has num_gpus only: vllm_gpu_keys).
nlohmann::json vllm_sweep_record(const nlohmann::json& point, const nlohmann::json& run, int64_t run_number);

// Writes DIR/vllm/SERVE-<point>-BENCH-request_rate=<rate>/summary.json (a list of one record)
// for every run of every point with a result, as vLLM's sweep lays out a serve × bench grid.
// DIR/vllm is tandem's: rewritten whole by each collect (a DIR/vllm without tandem's marker
// file is refused, never removed). Returns the number of records written.
int64_t write_vllm_sweep_layout(const std::map<int64_t, nlohmann::json>& results, const std::string& dir);

}  // namespace tandem
