// The loop's clock. Virtual: jumps to the next event and never reads the wall clock, so a
// simulated run is reproducible to the byte. Wall: waits until the event's time (real
// backends), and the wait is cut short by anything posted into the loop's inbox (a completion
// from another thread or process must not wait for the next timed event).
#pragma once
#include <chrono>

#include "core/time.h"
#include "sim/engine/inbox.h"

namespace tandem {

class clock_i {
 public:
  virtual ~clock_i() = default;
  // Waits until time t, or until something is posted into `inbox`, whichever comes first.
  // True: t is reached (the event due at t may be handled). False: the inbox holds something
  // to take in first (then the loop drains it and asks again).
  virtual bool wait_until(Time t, Inbox& inbox) = 0;
  // Current time: the virtual clock's position, or the real time elapsed since start.
  virtual Time now() const = 0;
  // True when now() is real time: only then does the loop's own work show on the timeline.
  virtual bool real() const { return false; }
};

class VirtualClock final : public clock_i {
 public:
  bool wait_until(Time t, Inbox& inbox) override {
    if (!inbox.empty()) return false;
    now_ = t > now_ ? t : now_;
    return true;
  }
  Time now() const override { return now_; }

 private:
  Time now_ = 0;
};

class WallClock final : public clock_i {
 public:
  WallClock() : start_(std::chrono::steady_clock::now()) {}
  bool wait_until(Time t, Inbox& inbox) override { return !inbox.wait_until(start_ + std::chrono::nanoseconds(t)); }
  Time now() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count();
  }
  bool real() const override { return true; }
  // Time 0 on steady_clock (CLOCK_MONOTONIC): another process's instants compare with the run's.
  std::chrono::steady_clock::time_point start() const { return start_; }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tandem
