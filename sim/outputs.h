// What a run leaves behind: the stdout summary table, and with --out DIR: summary.json,
// requests.csv, steps.csv and trace.json (Chrome / Perfetto). Keys and columns are a
// contract (DESIGN.md); add to them, never rename.
#pragma once
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "sim/engine.h"
#include "sim/metrics.h"

namespace tandem {

nlohmann::json summary_json(const Summary& s, const Workload& w);
void print_summary(std::ostream& os, const Summary& s);

// Streams steps.csv and trace.json while the run goes; requests.csv and summary.json at the end.
class RunOutputs final : public RunObserver {
 public:
  explicit RunOutputs(const std::string& dir);  // creates the folder; throws on failure
  void on_step(const StepRecord& r) override;
  void finish(const Engine& e, const Summary& s, const Workload& w);

 private:
  std::string dir_;
  std::ofstream steps_, trace_;
  bool first_trace_event_ = true;
  void trace_event(const nlohmann::json& ev);
};

// Progress on stderr, at most twice a second, only when stderr is a terminal.
class ProgressReporter final : public RunObserver {
 public:
  explicit ProgressReporter(int64_t total_requests);
  ~ProgressReporter() override;
  void on_step(const StepRecord& r) override;
  void on_request_done(const Request&) override { ++done_; }

 private:
  bool enabled_;
  int64_t total_, done_ = 0;
  double last_print_ = 0;
  bool printed_ = false;
};

}  // namespace tandem
