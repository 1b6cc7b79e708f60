// The front-end benchmark of tandem serve (a benchmark, not a test): starts
// `tandem serve WORKLOAD --backend sim --chunk-timestamps` on a free loopback port, then for each
// concurrency N opens N connections at once, each streaming one completion of --max-tokens tokens,
// and reports the streamed tokens per second (all chunks received over the time from the first
// request sent to the last chunk received) and the added latency per chunk: its receipt here
// minus the engine instant it was emitted at (the server's `: t=` comment, CLOCK_MONOTONIC ns on
// both sides), p50 and p99. The client reads with plain epoll (level-triggered, one recvmsg per
// ready socket: it costs its own CPU time per chunk, printed beside, and shares the cores with the
// server); the machine's load is printed beside.
// --split also prints where the added latency went, p50/p99 of each part per chunk: emitted ->
// pushed into the outbox (loop), -> the io thread's drain began (wake), -> the chunk made (its
// place in the drain), -> in this client's socket (send: the drain's sends, done at its end, and
// loopback; the kernel's receive stamp), -> read here (client); and emitted -> in the client's
// socket, p50/p99: the added latency without this client's own reading. Before each level it
// probes the idle machine for 2 s (1 ms sleeps woken over 1 ms late: the VM's own stalls).
// --client-threads N splits the streams over N reading threads, each with its own epoll (1: one).
//   bench_serve TANDEM WORKLOAD [--streams 64,256,1024] [--max-tokens N] [--prompt-len N] [--split]
//                               [--client-threads N]
#include <fmt/format.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

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

// One reading thread's figures (merged after the level).
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

// One streamed completion: its socket and what it has read so far.
struct Stream {
  int fd = -1;
  std::string line;       // the part of a line not ended yet
  int64_t kernel_at = 0;  // --split: the last read's kernel receive stamp (CLOCK_MONOTONIC ns)
  bool finished = false;  // [DONE] read
};

void append(Stats& into, const Stats& from) {
  into.tokens += from.tokens;
  into.done += from.done;
  into.failed += from.failed;
  into.queued += from.queued;
  if (from.first_sent && (!into.first_sent || from.first_sent < into.first_sent)) into.first_sent = from.first_sent;
  into.last_chunk = std::max(into.last_chunk, from.last_chunk);
  for (auto [to, v] : {std::pair{&into.added_ns, &from.added_ns},
                       {&into.loop_ns, &from.loop_ns},
                       {&into.wake_ns, &from.wake_ns},
                       {&into.order_ns, &from.order_ns},
                       {&into.kernel_ns, &from.kernel_ns},
                       {&into.client_ns, &from.client_ns},
                       {&into.at_socket_ns, &from.at_socket_ns}})
    to->insert(to->end(), v->begin(), v->end());
}

// The SSE lines a read completed: a chunk's stamp (": t=..."), a token ("data: {"), the end.
void parse(Stream& s, Stats& st, std::string_view data, int64_t now) {
  s.line.append(data);
  size_t start = 0;
  for (size_t nl; (nl = s.line.find('\n', start)) != std::string::npos; start = nl + 1) {
    const std::string_view l(s.line.data() + start, nl - start);
    if (l.starts_with(": t=")) {
      const int64_t at = field(l, ": t=");
      st.added_ns.push_back(now - at);
      if (st.split) {
        const int64_t pushed = field(l, " p="), woke = field(l, " d="), written = field(l, " w=");
        st.loop_ns.push_back(pushed - at);      // emitted -> in the outbox (the loop's thread)
        st.wake_ns.push_back(woke - pushed);    // -> the io thread's drain began (its wake-up)
        st.order_ns.push_back(written - woke);  // -> this chunk made (its place in the drain)
        st.queued += field(l, " q=");
        // The kernel's stamp is the last segment's arrival, which is this chunk's or a later one's
        // in the same read (a read takes what has arrived): an upper bound for this chunk.
        st.kernel_ns.push_back(s.kernel_at - written);  // -> in this client's socket (the drain's sends)
        st.client_ns.push_back(now - s.kernel_at);      // -> read here (the client's own delay)
        st.at_socket_ns.push_back(s.kernel_at - at);    // the added latency without the client's reading
      }
    } else if (l.starts_with("data: [DONE]")) {
      s.finished = true;
      ++st.done;
    } else if (l.starts_with("data: {")) {
      ++st.tokens;
      st.last_chunk = now;
    }
  }
  s.line.erase(0, start);
}

// A stream's connection (blocking, loopback: the handshake completes in the kernel's backlog,
// without waiting for the server to accept it).
bool connect_stream(Stream& s, int port, bool split) {
  s.fd = socket(AF_INET, SOCK_STREAM, 0);
  if (s.fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int on = 1;
  setsockopt(s.fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  if (split) setsockopt(s.fd, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on);
  return connect(s.fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
}

// Sends the request, then makes the socket non-blocking for its reader.
bool send_request(Stream& s, const std::string& request) {
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t k = send(s.fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (k <= 0) return false;
    sent += size_t(k);
  }
  return fcntl(s.fd, F_SETFL, fcntl(s.fd, F_GETFL) | O_NONBLOCK) == 0;
}

// One reading thread: an epoll of its own, level-triggered, one recvmsg per ready socket per
// wake-up. Streams join it as their requests go out (the main thread adds each as soon as its
// request is sent, so the first streams are read while the last requests go); it ends once every stream
// dealt to it has read [DONE] or failed, or after 120 s without a byte.
struct Reader {
  int ep = epoll_create1(0);
  std::atomic<size_t> added{0};    // streams added (main thread)
  std::atomic<bool> dealt{false};  // every stream of the level has been dealt: `added` is final
  Stats st;
};

void read_streams(Reader& r) {
  Stats& st = r.st;
  size_t ended = 0;
  int64_t last_byte = mono_ns();
  std::array<epoll_event, 256> ready{};
  std::array<char, 16384> buf{};
  while (!(r.dealt.load() && ended == r.added.load())) {
    const int k = epoll_wait(r.ep, ready.data(), int(ready.size()), 50);
    if (k < 0 && errno != EINTR) break;
    if (k <= 0) {
      if (mono_ns() - last_byte > 120'000'000'000) break;  // the streams left open count as failed
      continue;
    }
    for (int e = 0; e < k; ++e) {
      Stream& s = *static_cast<Stream*>(ready[size_t(e)].data.ptr);
      iovec iov{buf.data(), buf.size()};
      alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(timespec))];
      msghdr m{};
      m.msg_iov = &iov;
      m.msg_iovlen = 1;
      m.msg_control = ctl;
      m.msg_controllen = sizeof ctl;
      const ssize_t n = recvmsg(s.fd, &m, 0);
      const int64_t now = mono_ns();
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (n > 0) {
        last_byte = now;
        for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
          if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
            timespec t{};
            std::memcpy(&t, CMSG_DATA(c), sizeof t);
            s.kernel_at = int64_t(t.tv_sec) * 1'000'000'000 + t.tv_nsec - st.realtime_minus_mono;
          }
        parse(s, st, std::string_view(buf.data(), size_t(n)), now);
      }
      if (n <= 0 || s.finished) {  // the end, or the server closed / failed it
        epoll_ctl(r.ep, EPOLL_CTL_DEL, s.fd, nullptr);
        close(s.fd);
        s.fd = -1;
        if (!s.finished) ++st.failed;
        ++ended;
      }
    }
  }
}

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

// CPU time (user + system) in ns: this process's, or process `pid`'s from /proc (clock ticks).
int64_t own_cpu_ns() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return (int64_t(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1'000'000 + u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1000;
}
int64_t process_cpu_ns(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));  // after "pid (comm) "
  std::string field;
  int64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {  // fields 14 and 15: utime, stime
    if (i == 14) utime = std::stoll(field);
    if (i == 15) stime = std::stoll(field);
  }
  return (utime + stime) * (1'000'000'000 / sysconf(_SC_CLK_TCK));
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
        "usage: bench_serve TANDEM WORKLOAD [--streams 64,256,1024] [--max-tokens N] [--prompt-len N] [--split]\n"
        "                   [--client-threads N]\n");
    return 2;
  }
  std::vector<int> streams = {64, 256, 1024};
  int max_tokens = 200, prompt_len = 32, client_threads = 1;
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
    } else if (k == "--client-threads") {
      client_threads = std::max(1, std::stoi(v));
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
  std::string prompt_ids;  // "1000,1001,...": each stream's prompt is its own first id, then these
  for (int i = 0; i < prompt_len; ++i) prompt_ids += fmt::format("{}{}", i ? "," : "", 1000 + i);
  std::printf(
      "tandem serve front-end benchmark: %s, --backend sim, %d tokens a stream, prompt %d tokens, %d client "
      "thread(s)\n",
      argv[2], max_tokens, prompt_len, client_threads);
  std::printf("%8s %10s %12s %14s %14s %8s  %s\n", "streams", "tokens", "tokens/s", "added p50 ms", "added p99 ms",
              "failed", "load (1/5/15 min)");
  int rc = 0;
  for (int n : streams) {
    const Stalls stalls = probe_stalls(2.0);
    Stats st;
    st.split = split;
    st.realtime_minus_mono = real_ns() - mono_ns();
    const int64_t client_cpu0 = own_cpu_ns(), server_cpu0 = process_cpu_ns(pid);
    std::vector<Stream> all(static_cast<size_t>(n));  // never resized: epoll holds their addresses
    // The readers first, so that each stream is read from its first chunk on; stream i goes to
    // reader i % threads.
    const int threads = std::min(client_threads, n);
    std::vector<std::unique_ptr<Reader>> readers;
    std::vector<std::thread> reading;
    for (int t = 0; t < threads; ++t) {
      readers.push_back(std::make_unique<Reader>());
      readers.back()->st.split = split;
      readers.back()->st.realtime_minus_mono = st.realtime_minus_mono;
      reading.emplace_back(read_streams, std::ref(*readers.back()));
    }
    // All connections first, then the requests back to back (a burst, as clients opening streams
    // together send them): a request sent while others still connect would have its first chunks
    // wait behind the server's accepts.
    std::vector<std::string> requests;
    for (int i = 0; i < n; ++i) {
      // Each its own prompt (no prefix hits across streams).
      const std::string body =
          fmt::format(R"({{"prompt":[{},{}],"max_tokens":{},"stream":true}})", 7 + i, prompt_ids, max_tokens);
      requests.push_back(fmt::format(
          "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
          body.size(), body));
      if (!connect_stream(all[size_t(i)], port, split)) {
        if (all[size_t(i)].fd >= 0) close(all[size_t(i)].fd);
        all[size_t(i)].fd = -1;
        ++st.failed;
      }
    }
    st.first_sent = mono_ns();
    for (int i = 0; i < n; ++i) {
      Stream& s = all[size_t(i)];
      if (s.fd < 0) continue;
      if (!send_request(s, requests[size_t(i)])) {
        close(s.fd);
        s.fd = -1;
        ++st.failed;
        continue;
      }
      Reader& r = *readers[size_t(i % threads)];
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.ptr = &s;
      epoll_ctl(r.ep, EPOLL_CTL_ADD, s.fd, &ev);
      ++r.added;
    }
    for (auto& r : readers) r->dealt = true;
    for (std::thread& t : reading) t.join();
    for (auto& r : readers) {
      append(st, r->st);
      close(r->ep);
    }
    for (Stream& s : all)  // still open: a reader gave up on it (120 s without a byte)
      if (s.fd >= 0) {
        close(s.fd);
        ++st.failed;
      }
    const double chunks = double(std::max<int64_t>(1, st.tokens));
    const double client_us = double(own_cpu_ns() - client_cpu0) * 1e-3 / chunks;
    const double server_us = double(process_cpu_ns(pid) - server_cpu0) * 1e-3 / chunks;
    const double secs = double(st.last_chunk - st.first_sent) * 1e-9;
    std::printf("%8d %10lld %12.0f %14.3f %14.3f %8lld  %s\n", n, static_cast<long long>(st.tokens),
                secs > 0 ? double(st.tokens) / secs : 0.0, pct(st.added_ns, 50) * 1e-6, pct(st.added_ns, 99) * 1e-6,
                static_cast<long long>(st.failed), loadavg().c_str());
    std::printf("%8s  CPU time per chunk streamed: server %.1f us, this client %.1f us (user + system, whole level)\n",
                "", server_us, client_us);
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
