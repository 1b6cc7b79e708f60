// The loop's inbox: events that other threads hand to the single-threaded event loop (a
// backend's completion callback, a channel's socket reader). post() may be called from any
// thread; drain() runs on the loop's. A post wakes a wall clock that is waiting for a later
// event (as ns-3's WallClockSynchronizer::SleepWait is woken by DoSignal), so a completion is
// handled when it happens, not when the next timed event falls due.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "sim/engine/events.h"

namespace tandem {

class Inbox {
 public:
  void post(Event e) {
    {
      std::lock_guard lock(mu_);
      items_.push_back(std::move(e));
      size_.store(items_.size(), std::memory_order_release);
    }
    cv_.notify_one();
  }
  // Lock-free, so that the loop can ask before every event at no cost in simulated time.
  bool empty() const { return size_.load(std::memory_order_acquire) == 0; }
  // Waits until `deadline` or until something is posted, whichever comes first. Returns true
  // if the inbox holds something (the wait was cut short, or it was not empty to begin with).
  bool wait_until(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock lock(mu_);
    return cv_.wait_until(lock, deadline, [this] { return !items_.empty(); });
  }
  // Hands every posted event to f, in posting order, on the caller's thread. Events posted
  // while f runs wait for the next drain.
  template <class F>
  size_t drain(F&& f) {
    if (empty()) return 0;
    {
      std::lock_guard lock(mu_);
      taken_.swap(items_);
      size_.store(0, std::memory_order_release);
    }
    for (Event& e : taken_) f(std::move(e));
    const size_t n = taken_.size();
    taken_.clear();
    return n;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Event> items_;     // guarded by mu_
  std::atomic<size_t> size_{0};  // items_.size(), readable without the lock
  std::vector<Event> taken_;     // the loop's side of a drain (no lock needed)
};

}  // namespace tandem
