#include "sim/remote/worker_child.h"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>
#include <vector>

extern char** environ;

namespace tandem {

using std::chrono::milliseconds;

WorkerChild::WorkerChild(const std::string& backend, int threads, const std::string& checkpoint) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("tcp channel: pipe() failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  const std::string threads_s = std::to_string(threads);
  std::vector<std::string> args = {"tandem", "worker", "--listen", "127.0.0.1:0", "--once", "--backend", backend};
  if (backend == "cpu") args.insert(args.end(), {"--threads", threads_s});
  // Its checkpoint root is this run's checkpoint: it serves that folder and nothing else.
  if (!checkpoint.empty()) args.insert(args.end(), {"--checkpoint-root", checkpoint});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int rc = posix_spawn(&pid_, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    pid_ = -1;
    throw std::runtime_error(fmt::format("tcp channel: starting the decode worker failed: {}", std::strerror(rc)));
  }
  // Its first line says where it listens: "tandem worker: listening on 127.0.0.1:PORT".
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (line.find('\n') == std::string::npos) {
    pollfd p{fds[0], POLLIN, 0};
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    char buf[256];
    ssize_t n = 0;
    if (left <= 0 || poll(&p, 1, int(left)) <= 0 || (n = read(fds[0], buf, sizeof buf)) <= 0) break;
    line.append(buf, size_t(n));
  }
  close(fds[0]);
  const size_t colon = line.rfind(':');
  const size_t nl = line.find('\n');
  if (nl == std::string::npos || colon == std::string::npos || colon > nl) {
    end(std::chrono::steady_clock::now());
    throw std::runtime_error("tcp channel: the decode worker did not say where it listens (it failed to start)");
  }
  port_ = uint16_t(std::stoi(line.substr(colon + 1, nl - colon - 1)));
}

void WorkerChild::end(std::chrono::steady_clock::time_point deadline) {
  if (pid_ <= 0) return;
  while (waitpid(pid_, nullptr, WNOHANG) != pid_) {
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      break;
    }
    usleep(10'000);
  }
  pid_ = -1;
}

}  // namespace tandem
