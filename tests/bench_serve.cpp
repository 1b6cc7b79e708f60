// The front-end benchmark of tandem serve (a benchmark, not a test): starts
// `tandem serve WORKLOAD --backend sim --chunk-timestamps` on a free loopback port, then for each
// concurrency N opens N connections at once, each streaming one completion of --max-tokens tokens,
// and reports the streamed tokens per second (all chunks received over the time from the first
// request sent to the last chunk received) and the added latency per chunk: its receipt here
// minus the engine instant it was emitted at (the server's `: t=` comment, CLOCK_MONOTONIC ns on
// both sides), p50 and p99. The client is one Asio thread; the machine's load is printed beside.
// --split also prints where the added latency went, p50/p99 of each part per chunk: emitted ->
// pushed into the outbox (loop), -> the io thread's drain began (wake), -> the chunk made (its
// place in the drain), -> in this client's socket (send: the drain's sends, done at its end, and
// loopback; the kernel's receive stamp), -> read here (client); and emitted -> in the client's
// socket, p50/p99: the added latency without this client's own reading. Before each level it
// probes the idle machine for 2 s (1 ms sleeps woken over 1 ms late: the VM's own stalls).
//   bench_serve TANDEM WORKLOAD [--streams 64,256,1024] [--max-tokens N] [--prompt-len N] [--split]
#include <fmt/format.h>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

int64_t mono_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

struct Stats {
  int64_t tokens = 0, done = 0, failed = 0;
  int64_t first_sent = 0, last_chunk = 0;
  std::vector<int64_t> added_ns;
  // --split: the added latency's parts, per chunk (the server's stamps, see serve/frontend.cpp).
  bool split = false;
  int64_t realtime_minus_mono = 0;  // the kernel's receive stamps are CLOCK_REALTIME
  int64_t queued = 0;               // chunks that waited behind their socket's write in flight
  std::vector<int64_t> loop_ns, wake_ns, order_ns, kernel_ns, client_ns;
  std::vector<int64_t> at_socket_ns;  // emitted -> in this client's socket: the server and loopback, not the client
};

int64_t real_ns() {
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  return int64_t(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

// The number after `key` in a stamp line, 0 if absent.
int64_t field(std::string_view l, std::string_view key) {
  const size_t at = l.find(key);
  if (at == std::string_view::npos) return 0;
  return std::strtoll(l.data() + at + key.size(), nullptr, 10);
}

class Stream : public std::enable_shared_from_this<Stream> {
 public:
  Stream(asio::io_context& io, Stats& st, std::string request) : sock_(io), st_(st), req_(std::move(request)) {}
  void start(const tcp::endpoint& ep) {
    sock_.async_connect(ep, [self = shared_from_this()](boost::system::error_code ec) {
      if (ec) return self->fail();
      self->sock_.set_option(tcp::no_delay(true));
      if (self->st_.split) {
        const int on = 1;
        setsockopt(self->sock_.native_handle(), SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on);
        self->sock_.non_blocking(true);
      }
      if (self->st_.first_sent == 0) self->st_.first_sent = mono_ns();
      asio::async_write(self->sock_, asio::buffer(self->req_), [self](boost::system::error_code e, size_t) {
        if (e) return self->fail();
        self->read();
      });
    });
  }

 private:
  void read() {
    if (st_.split) return read_stamped();
    sock_.async_read_some(asio::buffer(buf_), [self = shared_from_this()](boost::system::error_code ec, size_t n) {
      const int64_t now = mono_ns();
      if (n) self->parse(std::string_view(self->buf_.data(), n), now);
      if (ec) {
        if (!self->finished_) self->fail();
        return;
      }
      self->read();
    });
  }
  // --split: recvmsg with the kernel's receive stamp (SO_TIMESTAMPNS: when the bytes reached this
  // socket, i.e. the server's send on loopback), so the client's own delay is its own column.
  void read_stamped() {
    sock_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](boost::system::error_code ec) {
      if (ec) return self->fail();
      for (;;) {
        iovec iov{self->buf_.data(), self->buf_.size()};
        alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(timespec))];
        msghdr m{};
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = ctl;
        m.msg_controllen = sizeof ctl;
        const ssize_t n = recvmsg(self->sock_.native_handle(), &m, 0);
        const int64_t now = mono_ns();
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (n <= 0) {
          if (!self->finished_) self->fail();
          return;
        }
        self->kernel_at_ = 0;
        for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
          if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
            timespec t{};
            std::memcpy(&t, CMSG_DATA(c), sizeof t);
            self->kernel_at_ = int64_t(t.tv_sec) * 1'000'000'000 + t.tv_nsec - self->st_.realtime_minus_mono;
          }
        self->parse(std::string_view(self->buf_.data(), size_t(n)), now);
      }
      self->read_stamped();
    });
  }
  void parse(std::string_view data, int64_t now) {
    line_.append(data);
    size_t start = 0;
    for (size_t nl; (nl = line_.find('\n', start)) != std::string::npos; start = nl + 1) {
      const std::string_view l(line_.data() + start, nl - start);
      if (l.starts_with(": t=")) {
        const int64_t at = std::stoll(std::string(l.substr(4)));
        st_.added_ns.push_back(now - at);
        if (st_.split) {
          const int64_t pushed = field(l, " p="), woke = field(l, " d="), written = field(l, " w=");
          st_.loop_ns.push_back(pushed - at);      // emitted -> in the outbox (the loop's thread)
          st_.wake_ns.push_back(woke - pushed);    // -> the io thread's drain began (its wake-up)
          st_.order_ns.push_back(written - woke);  // -> this chunk made (its place in the drain)
          st_.queued += field(l, " q=");
          // The kernel's stamp is the last segment's arrival, which is this chunk's or a later one's
          // in the same read (a read takes what has arrived): an upper bound for this chunk.
          st_.kernel_ns.push_back(kernel_at_ - written);  // -> in this client's socket (the drain's sends)
          st_.client_ns.push_back(now - kernel_at_);      // -> read here (the client's own delay)
          st_.at_socket_ns.push_back(kernel_at_ - at);    // the added latency without the client's reading
        }
      } else if (l.starts_with("data: [DONE]")) {
        finished_ = true;
        ++st_.done;
      } else if (l.starts_with("data: {")) {
        ++st_.tokens;
        st_.last_chunk = now;
      }
    }
    line_.erase(0, start);
  }
  void fail() {
    if (!finished_) ++st_.failed;
    finished_ = true;
  }

  tcp::socket sock_;
  Stats& st_;
  std::string req_;
  std::array<char, 16384> buf_{};
  std::string line_;
  int64_t kernel_at_ = 0;  // --split: the last read's kernel receive stamp (CLOCK_MONOTONIC ns)
  bool finished_ = false;
};

// The machine's own stalls, measured just before a level with nothing of the benchmark running:
// a thread sleeping 1 ms at a time for `secs`, and how often it woke over 1 ms late. On a shared
// VM a stall of a few ms hits a whole step's chunks, so a short run's p99 follows these, not the
// server (2026-12-06: a few a second here with the machine otherwise idle).
struct Stalls {
  int64_t over_1ms = 0;
  double max_ms = 0, secs = 0;
};
Stalls probe_stalls(double secs) {
  Stalls s;
  s.secs = secs;
  const int64_t end = mono_ns() + int64_t(secs * 1e9);
  while (mono_ns() < end) {
    const int64_t t0 = mono_ns();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const double late_ms = double(mono_ns() - t0) * 1e-6 - 1.0;
    s.over_1ms += late_ms > 1.0;
    s.max_ms = std::max(s.max_ms, late_ms);
  }
  return s;
}

double pct(std::vector<int64_t>& v, double p) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, size_t(p / 100 * double(v.size())));
  std::nth_element(v.begin(), v.begin() + long(k), v.end());
  return double(v[k]);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(
        stderr,
        "usage: bench_serve TANDEM WORKLOAD [--streams 64,256,1024] [--max-tokens N] [--prompt-len N] [--split]\n");
    return 2;
  }
  std::vector<int> streams = {64, 256, 1024};
  int max_tokens = 200, prompt_len = 32;
  bool split = false;
  for (int i = 3; i < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--split") {
      split = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) break;
    const std::string v = argv[i + 1];
    if (k == "--streams") {
      streams.clear();
      std::stringstream ss(v);
      for (std::string x; std::getline(ss, x, ',');) streams.push_back(std::stoi(x));
    } else if (k == "--max-tokens") {
      max_tokens = std::stoi(v);
    } else if (k == "--prompt-len") {
      prompt_len = std::stoi(v);
    }
  }
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
  // The server, its stderr read for the port.
  int err_pipe[2];
  if (pipe(err_pipe) != 0) return 1;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(err_pipe[1], 2);
    close(err_pipe[0]);
    execl(argv[1], argv[1], "serve", argv[2], "--backend", "sim", "--listen", "127.0.0.1:0", "--chunk-timestamps",
          "--max-queue", "100000", "--drain-s", "0", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(err_pipe[1]);
  FILE* err = fdopen(err_pipe[0], "r");
  int port = 0;
  char line[1024];
  while (fgets(line, sizeof line, err)) {
    std::fputs(line, stderr);
    if (const char* p = std::strstr(line, "listening on http://")) {
      port = std::atoi(std::strrchr(p, ':') + 1);
      break;
    }
  }
  if (port == 0) {
    std::fprintf(stderr, "bench_serve: the server did not start\n");
    return 1;
  }
  std::string prompt = "[";
  for (int i = 0; i < prompt_len; ++i) prompt += fmt::format("{}{}", i ? "," : "", 1000 + i);
  prompt += "]";
  std::printf("tandem serve front-end benchmark: %s, --backend sim, %d tokens a stream, prompt %d tokens\n", argv[2],
              max_tokens, prompt_len);
  std::printf("%8s %10s %12s %14s %14s %8s  %s\n", "streams", "tokens", "tokens/s", "added p50 ms", "added p99 ms",
              "failed", "load (1/5/15 min)");
  int rc = 0;
  for (int n : streams) {
    const Stalls stalls = probe_stalls(2.0);
    asio::io_context io;
    Stats st;
    st.split = split;
    st.realtime_minus_mono = real_ns() - mono_ns();
    const tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), uint16_t(port));
    for (int i = 0; i < n; ++i) {
      // Each its own prompt (no prefix hits across streams).
      const std::string body = fmt::format(R"({{"prompt":[{}{}],"max_tokens":{},"stream":true}})", 7 + i,
                                           "," + prompt.substr(1, prompt.size() - 2), max_tokens);
      const std::string req = fmt::format(
          "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
          body.size(), body);
      std::make_shared<Stream>(io, st, req)->start(ep);
    }
    io.run();
    const double secs = double(st.last_chunk - st.first_sent) * 1e-9;
    std::printf("%8d %10lld %12.0f %14.3f %14.3f %8lld  %s\n", n, static_cast<long long>(st.tokens),
                secs > 0 ? double(st.tokens) / secs : 0.0, pct(st.added_ns, 50) * 1e-6, pct(st.added_ns, 99) * 1e-6,
                static_cast<long long>(st.failed), loadavg().c_str());
    std::printf(
        "%8s  the machine just before (idle): 1 ms sleeps for %.0f s woke over 1 ms late %lld times, the "
        "latest by %.2f ms\n",
        "", stalls.secs, static_cast<long long>(stalls.over_1ms), stalls.max_ms);
    if (split) {
      std::printf("%8s  where the added latency went, per chunk, p50/p99 ms:", "");
      const std::pair<const char*, std::vector<int64_t>*> parts[] = {{"loop", &st.loop_ns},
                                                                     {"wake", &st.wake_ns},
                                                                     {"made", &st.order_ns},
                                                                     {"send", &st.kernel_ns},
                                                                     {"client", &st.client_ns}};
      for (const auto& [name, v] : parts) std::printf(" %s %.3f/%.3f", name, pct(*v, 50) * 1e-6, pct(*v, 99) * 1e-6);
      std::printf("; %lld of %lld chunks queued behind a write\n", static_cast<long long>(st.queued),
                  static_cast<long long>(st.added_ns.size()));
      std::printf(
          "%8s  emitted -> in the client's socket (the server and loopback, without the client's reads): "
          "p50 %.3f ms, p99 %.3f ms\n",
          "", pct(st.at_socket_ns, 50) * 1e-6, pct(st.at_socket_ns, 99) * 1e-6);
    }
    std::fflush(stdout);
    if (st.failed > 0 || st.tokens != int64_t(n) * max_tokens) rc = 1;
  }
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  return rc;
}
