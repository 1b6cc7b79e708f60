// The decode worker a run starts for itself when its tcp channel names no peer: this executable
// as `tandem worker --listen 127.0.0.1:0 --once`, whose first line says the port it took.
#pragma once
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace tandem {

class WorkerChild {
 public:
  // Starts it and reads its port (std::runtime_error if it does not start or say so within 60 s).
  // Its checkpoint root is the run's checkpoint: it serves that folder and nothing else.
  WorkerChild(const std::string& backend, int threads, const std::string& checkpoint);
  ~WorkerChild() { end(std::chrono::steady_clock::now()); }
  WorkerChild(const WorkerChild&) = delete;
  WorkerChild& operator=(const WorkerChild&) = delete;
  uint16_t port() const { return port_; }
  // Waits until `deadline` for it to exit (it does at Bye or when the connection closes), then
  // kills it: a stopped or hung child never holds the end of the run. Idempotent.
  void end(std::chrono::steady_clock::time_point deadline);

 private:
  pid_t pid_ = -1;
  uint16_t port_ = 0;
};

}  // namespace tandem
