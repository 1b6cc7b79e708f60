// The front end's second sender: a thread that sends a large batch of socket writes together with
// the io thread, each taking the next write not yet taken. At GPU pace a step's tokens reach the
// io thread at once, one chunk for each of up to max_num_seqs sockets, and each loopback send
// costs a few µs of kernel time (the receiver's TCP path and its wake-up run in the sender's
// syscall): one thread sending 256 of them in a row makes the last stream wait for the other 255.
// Only the ::send calls run here: the sessions' state stays on the io thread, which waits for this
// thread to be done before it goes on, so no socket is closed or buffer touched while a send is
// under way.
#pragma once
#include <sys/socket.h>
#include <sys/types.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <span>
#include <thread>

namespace tandem::serve {

struct SendJob {
  int fd = -1;
  const char* data = nullptr;
  size_t size = 0;
  ssize_t sent = 0;  // what ::send returned (-1: see err)
  int err = 0;
};

inline void send_now(SendJob& j) {
  j.sent = ::send(j.fd, j.data, j.size, MSG_DONTWAIT | MSG_NOSIGNAL);
  j.err = j.sent < 0 ? errno : 0;
}

class ParallelSend {
 public:
  ParallelSend() : thread_([this] { loop(); }) {}
  ~ParallelSend() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  ParallelSend(const ParallelSend&) = delete;
  ParallelSend& operator=(const ParallelSend&) = delete;

  // Sends every job, on this object's thread and on the caller's, each taking the next job not yet
  // taken; returns when all are sent (or refused: each job's sent and err say). Taken one at a
  // time rather than in halves: when one thread's core stalls (a VM's vCPU descheduled for a few
  // ms), only the send it is in waits, while the other thread sends the rest.
  void send_all(std::span<SendJob> jobs) {
    {
      std::lock_guard lock(mu_);
      work_ = jobs;
      next_.store(0, std::memory_order_relaxed);
      busy_ = true;
    }
    cv_.notify_one();
    send_taken(jobs);
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return !busy_; });
  }

 private:
  void send_taken(std::span<SendJob> jobs) {
    for (size_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < jobs.size();) send_now(jobs[i]);
  }
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return busy_ || stop_; });
      if (busy_) {
        const std::span<SendJob> work = work_;
        lock.unlock();
        send_taken(work);
        lock.lock();
        busy_ = false;
        cv_.notify_all();  // the io thread waits on the same variable
        continue;
      }
      if (stop_) return;
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::span<SendJob> work_;      // guarded by mu_
  std::atomic<size_t> next_{0};  // the next job to take (both threads)
  bool busy_ = false, stop_ = false;
  std::thread thread_;  // last: it starts once the rest is made
};

}  // namespace tandem::serve
