#include "sim/outputs/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

namespace tandem {

namespace {
double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

ProgressReporter::ProgressReporter(int64_t total) : enabled_(isatty(STDERR_FILENO) == 1), total_(total) {
  last_print_ = wall_seconds();
}

ProgressReporter::~ProgressReporter() {
  if (printed_) fmt::print(stderr, "\n");
}

void ProgressReporter::on_step(const StepRecord& r) {
  if (!enabled_ || (r.index & 255) != 0) return;
  const double now = wall_seconds();
  if (now - last_print_ < 0.5) return;
  last_print_ = now;
  printed_ = true;
  fmt::print(stderr, "\r[tandem] t={:.1f}s  done {}/{}  running {}  waiting {}   ", to_seconds(r.start), done_, total_,
             r.running, r.waiting);
}

}  // namespace tandem
