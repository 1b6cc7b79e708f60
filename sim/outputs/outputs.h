// The files a run writes with --out DIR: summary.json, requests.csv, steps.csv, trace.json
// (Chrome / Perfetto), workload.resolved.yaml and vllm_result.json (vLLM's benchmark result,
// sim/outputs/outputs_vllm.h). Their keys and columns are in sim/outputs/outputs_schema.h; this file is the
// writer (a thread that formats rows off the loop).
#pragma once
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "sim/engine/engine.h"
#include "sim/engine/metrics.h"
#include "sim/outputs/outputs_schema.h"
#include "sim/outputs/progress.h"

namespace tandem {

class VllmResult;

// Writes steps.csv and the trace's step events while the run goes, requests.csv, the
// request spans, summary.json and vllm_result.json at the end. on_step only copies a step's
// numbers (and notes when its sampled tokens came, for vllm_result.json); a writer thread
// formats them and writes the files in large chunks, off the event loop.
class RunOutputs final : public run_observer_i {
 public:
  // Creates the folder; throws InputError when it cannot be made or written. `layout`: the run's
  // (Engine::layout()); with several instances steps.csv gains a `role` column, and the trace
  // names each instance's track by its role (none: one instance, unnamed).
  explicit RunOutputs(const std::string& dir, TraceDetail trace = TraceDetail::Full, const RunLayout* layout = nullptr);
  ~RunOutputs() override;
  RunOutputs(const RunOutputs&) = delete;
  RunOutputs& operator=(const RunOutputs&) = delete;
  void on_step(const StepRecord& r) override;
  void on_request_done(const Request& r) override;
  // Waits for the writer, then writes the rest. Throws std::runtime_error if a write failed.
  void finish(const Engine& e, const Summary& s, const Workload& w);

  // One step as the writer needs it (the plan is gone by the time it is written).
  struct StepRow {
    int64_t index;
    Time start;
    Duration elapsed, host;  // host: -1 where not measured
    StepCost cost;
    double attn_pairs, context_tokens;
    int32_t instance, seqs, prefill_seqs, decode_seqs, tokens, samples;
    int32_t kv_used, kv_reserved, kv_capacity, waiting, running;
    bool after_idle;
  };
  // A file written from a large in-memory buffer: room(n) gives n writable bytes, commit(end)
  // keeps what was written up to `end`; full chunks go out in one write. Without a file (f
  // null) the buffer only grows.
  struct File {
    std::FILE* f = nullptr;
    bool failed = false;
    std::unique_ptr<char[]> data;
    size_t len = 0, cap = 0;
    bool open(const std::string& path);
    char* room(size_t n) {
      if (cap - len < n) make_room(n);
      return data.get() + len;
    }
    void commit(const char* end) { len = size_t(end - data.get()); }
    void append(std::string_view s);
    void maybe_flush() {
      if (f && len >= kChunk) flush();
    }
    void flush();
    bool close();  // false if any write failed
    ~File();
    static constexpr size_t kChunk = size_t(1) << 20;

   private:
    void make_room(size_t n);
  };

 private:
  std::string dir_;
  TraceDetail detail_;
  std::vector<std::string> roles_;  // by instance, when there are several (steps.csv's role column)
  File steps_, trace_;
  struct StepFormatter;
  std::unique_ptr<StepFormatter> formatter_;  // the writer thread's
  std::unique_ptr<VllmResult> vllm_;          // the main thread's: token times, vllm_result.json

  // Main thread fills `pending_`; full batches go through `queue_` to the writer thread.
  std::vector<StepRow> pending_;
  std::vector<std::vector<StepRow>> queue_, spare_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr writer_error_;
  std::thread writer_;

  void submit_pending();
  void stop_writer();
  void writer_loop();
  void write_rows(const std::vector<StepRow>& rows);
};

}  // namespace tandem
