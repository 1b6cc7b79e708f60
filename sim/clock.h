// The loop's clock. Virtual: jumps to the next event and never reads the wall clock, so a
// simulated run is reproducible to the byte. Wall: waits until the event's time (real backends).
#pragma once
#include <chrono>
#include <thread>

#include "sim/time.h"

namespace tandem {

class clock_i {
 public:
  virtual ~clock_i() = default;
  virtual void advance_to(Time t) = 0;
  // Current time: the virtual clock's position, or the real time elapsed since start.
  virtual Time now() const = 0;
};

class VirtualClock final : public clock_i {
 public:
  void advance_to(Time t) override { now_ = t > now_ ? t : now_; }
  Time now() const override { return now_; }

 private:
  Time now_ = 0;
};

class WallClock final : public clock_i {
 public:
  WallClock() : start_(std::chrono::steady_clock::now()) {}
  void advance_to(Time t) override { std::this_thread::sleep_until(start_ + std::chrono::nanoseconds(t)); }
  Time now() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tandem
