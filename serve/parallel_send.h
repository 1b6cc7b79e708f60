// The front end's second sender: a thread that sends half of a large batch of socket writes while
// the io thread sends the other half. At GPU pace a step's tokens reach the io thread at once, one
// chunk for each of up to max_num_seqs sockets, and each loopback send costs a few µs of kernel
// time (the receiver's TCP path and its wake-up run in the sender's syscall): one thread sending
// 256 of them in a row makes the last stream wait for the other 255. Only the ::send calls run
// here: the sessions' state stays on the io thread, which waits for this thread's half before it
// goes on, so no socket is closed or buffer touched while a send is under way.
#pragma once
#include <sys/socket.h>
#include <sys/types.h>

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

  // Sends every job, the first half on this object's thread and the rest on the caller's; returns
  // when all are sent (or refused: each job's sent and err say).
  void send_all(std::span<SendJob> jobs) {
    const size_t half = jobs.size() / 2;
    {
      std::lock_guard lock(mu_);
      work_ = jobs.first(half);
      busy_ = true;
    }
    cv_.notify_one();
    for (SendJob& j : jobs.subspan(half)) send_now(j);
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return !busy_; });
  }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return busy_ || stop_; });
      if (busy_) {
        const std::span<SendJob> work = work_;
        lock.unlock();
        for (SendJob& j : work) send_now(j);
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
  std::span<SendJob> work_;  // guarded by mu_
  bool busy_ = false, stop_ = false;
  std::thread thread_;  // last: it starts once the rest is made
};

}  // namespace tandem::serve
