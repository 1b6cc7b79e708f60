// Progress of a run on stderr.
#pragma once
#include <cstdint>

#include "sim/engine/engine.h"

namespace tandem {

// Progress on stderr, at most twice a second, only when stderr is a terminal.
class ProgressReporter final : public run_observer_i {
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
