#include "backend/transfer/tcp_link.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cerrno>
#include <climits>
#include <cstring>

namespace tandem::transfer {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

struct TcpLink::Socket {
  asio::io_context io;
  tcp::socket sock{io};
};

struct TcpListener::Acceptor {
  asio::io_context io;
  tcp::acceptor acc{io};
};

namespace {

constexpr auto kConnectRetry = std::chrono::milliseconds(50);
// Refused this many times in a row (about a second): nothing listens there, most likely a mistyped
// port, so connect says so then rather than at its timeout (30 s by default). A peer that is still
// starting listens within that second; one still loading a model accepts first and answers later.
constexpr int kRefusedTries = 20;
// The payload buffer grows as bytes arrive, from this size up, doubling: a peer that announces
// a large frame and sends nothing costs no more than what it sent.
constexpr size_t kFirstPayloadChunk = size_t{1} << 20;

std::string endpoint_name(const tcp::endpoint& ep) {
  const auto a = ep.address();
  return a.is_v6() ? fmt::format("[{}]:{}", a.to_string(), ep.port()) : fmt::format("{}:{}", a.to_string(), ep.port());
}

std::string host_port(const std::string& host, uint16_t port) {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

long long ms_of(std::chrono::milliseconds d) { return static_cast<long long>(d.count()); }

// Runs io until `done` or the deadline. On the deadline, cancel() aborts the operation and its
// handler is drained before returning false, so nothing refers to the caller's locals
// afterwards (an operation that completed right at the deadline is dropped with it).
template <class Cancel>
bool run_until(asio::io_context& io, Clock::time_point deadline, const bool& done, Cancel cancel) {
  io.restart();
  while (!done && Clock::now() < deadline)
    if (io.run_one_until(deadline) == 0 && io.stopped()) break;  // out of work
  if (done) return true;
  cancel();
  io.restart();
  io.run();
  return false;
}

// The milliseconds poll() may wait: -1 (forever) without a deadline, else rounded up.
int poll_ms(std::optional<Clock::time_point> deadline) {
  if (!deadline) return -1;
  const auto left = *deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<decltype(ms)>(ms, INT_MAX));
}

// Waits for fd to be ready for `events`; false on the deadline. Errors and hang-ups count as
// ready: the next recv/send reports them.
bool wait_fd(int fd, short events, std::optional<Clock::time_point> deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int ms = poll_ms(deadline);
    const int r = ::poll(&p, 1, ms);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return true;               // let the socket call report the error
    if (r == 0 && Clock::now() >= *deadline) return false;  // r == 0 only with a deadline
  }
}

void set_socket_options(tcp::socket& s) {
  boost::system::error_code ec;
  s.set_option(tcp::no_delay(true), ec);  // frames are whole messages: no Nagle delay on small ones
  // An idle link is normal (the reader waits without limit between frames); keepalive is what
  // notices a peer host that vanished without closing. Failures here cost only that.
  s.set_option(asio::socket_base::keep_alive(true), ec);
  const int fd = s.native_handle();
  const int idle_s = 10, interval_s = 5, probes = 3;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s);
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s);
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
  // Reads and writes poll() first and must never block inside recv/send: not optional.
  s.non_blocking(true, ec);
  if (ec) throw TransportError("cannot make a socket non-blocking: " + ec.message());
}

}  // namespace

// ---- TcpLink ----

TcpLink::TcpLink(std::unique_ptr<Socket> socket) : socket_(std::move(socket)) {
  set_socket_options(socket_->sock);
  fd_ = socket_->sock.native_handle();
  boost::system::error_code ec;
  const auto ep = socket_->sock.remote_endpoint(ec);
  peer_ = ec ? "(unknown peer)" : endpoint_name(ep);
}

TcpLink::~TcpLink() { close(); }

std::unique_ptr<TcpLink> TcpLink::connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout) {
  const auto start = Clock::now(), deadline = start + timeout;
  std::string last = "no attempt made";
  int refused = 0;  // connection refused, in a row
  for (;;) {
    auto s = std::make_unique<Socket>();
    boost::system::error_code ec;
    tcp::resolver::results_type endpoints;
    bool resolved = false;
    tcp::resolver resolver(s->io);
    resolver.async_resolve(host, std::to_string(port),
                           [&](const boost::system::error_code& e, tcp::resolver::results_type r) {
                             ec = e;
                             endpoints = std::move(r);
                             resolved = true;
                           });
    if (!run_until(s->io, deadline, resolved, [&] { resolver.cancel(); })) {
      last = "name resolution timed out";
      break;
    }
    if (!ec) {
      bool connected = false;
      asio::async_connect(s->sock, endpoints, [&](const boost::system::error_code& e, const tcp::endpoint&) {
        ec = e;
        connected = true;
      });
      if (!run_until(s->io, deadline, connected, [&] { s->sock.close(); })) {
        last = "connection attempt timed out";
        break;
      }
      if (!ec) return std::make_unique<TcpLink>(std::move(s));
    }
    last = ec.message();
    refused = ec == asio::error::connection_refused ? refused + 1 : 0;
    if (refused >= kRefusedTries)
      throw TransportError(fmt::format("cannot connect to {}: connection refused {} times in a row over {} ms: "
                                       "nothing listens there (is the worker started, and is the port right?)",
                                       host_port(host, port), refused,
                                       std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start)
                                           .count()));
    if (Clock::now() + kConnectRetry >= deadline) break;
    std::this_thread::sleep_for(kConnectRetry);
  }
  throw TransportError(
      fmt::format("cannot connect to {} within {} ms: {}", host_port(host, port), ms_of(timeout), last));
}

TcpLink::Io TcpLink::read_exact(std::span<uint8_t> out, std::optional<Clock::time_point> deadline, size_t& got,
                                int& err) {
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t r = ::recv(fd_, out.data() + done, out.size() - done, 0);
    if (r > 0) {
      done += static_cast<size_t>(r);
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return Io::Closed;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      err = errno;
      return Io::Failed;
    }
    if (!wait_fd(fd_, POLLIN, deadline)) return Io::Timeout;
  }
  return Io::Ok;
}

Frame TcpLink::receive_frame(std::optional<Clock::time_point> first_byte_deadline,
                             std::optional<Clock::time_point> frame_deadline, std::chrono::milliseconds frame_timeout) {
  if (!receive_broken_.empty()) throw TransportError(receive_broken_);
  if (closing_) throw TransportError(fmt::format("link to peer {} was closed locally", peer_));
  size_t got = 0;
  uint64_t frame_bytes = kHeaderBytes;  // known in full once the header is read
  int err = 0;
  // Every failure after the first byte leaves the stream out of step: the link is done.
  const auto fail = [&](Io io, const std::string& corrupt = {}) -> TransportError {
    std::string why;
    if (closing_)
      why = fmt::format("link to peer {} was closed locally", peer_);
    else if (!corrupt.empty())
      why = fmt::format("corrupt frame from peer {}: {}", peer_, corrupt);
    else if (io == Io::Closed && got == 0)
      why = fmt::format("peer {} closed the connection", peer_);
    else if (io == Io::Closed)
      why = fmt::format("peer {} closed the connection in the middle of a frame ({} of {} bytes)", peer_, got,
                        frame_bytes);
    else if (io == Io::Timeout && got == 0)
      return TransportError(fmt::format("no frame from peer {} within {} ms", peer_, ms_of(frame_timeout)));
    else if (io == Io::Timeout)
      why = fmt::format("timed out receiving a frame from peer {}: {} of {} bytes", peer_, got, frame_bytes);
    else
      why = fmt::format("receiving from peer {} failed: {}", peer_, std::strerror(err));
    receive_broken_ = why;
    return TransportError(why);
  };

  std::array<uint8_t, kHeaderBytes> header{};
  if (const Io io = read_exact(std::span(header).first(1), first_byte_deadline, got, err); io != Io::Ok) throw fail(io);
  const auto deadline = frame_deadline ? *frame_deadline : Clock::now() + frame_timeout;
  if (const Io io = read_exact(std::span(header).subspan(1), deadline, got, err); io != Io::Ok) throw fail(io);
  FrameHeader h;
  try {
    h = parse_header(header, max_payload_.load());
  } catch (const WireError& e) {
    throw fail(Io::Ok, e.what());
  }
  frame_bytes += h.payload_len;
  Frame f{h.type, {}};
  size_t have = 0;
  while (have < h.payload_len) {
    const size_t next = static_cast<size_t>(std::min<uint64_t>(h.payload_len, std::max(2 * have, kFirstPayloadChunk)));
    f.payload.resize(next);
    if (const Io io = read_exact(std::span(f.payload).subspan(have), deadline, got, err); io != Io::Ok) throw fail(io);
    have = next;
  }
  try {
    check_payload(h, f.payload);
  } catch (const WireError& e) {
    throw fail(Io::Ok, e.what());
  }
  return f;
}

Frame TcpLink::receive(std::chrono::milliseconds timeout) {
  if (reader_started_) throw std::logic_error("TcpLink::receive: the reader thread receives on this link");
  std::lock_guard lk(receive_mu_);
  const auto deadline = Clock::now() + timeout;
  return receive_frame(deadline, deadline, timeout);
}

void TcpLink::send(MsgType type, std::span<const uint8_t> payload) { send(type, payload, write_timeout_.load()); }

void TcpLink::send(MsgType type, std::span<const uint8_t> payload, std::chrono::milliseconds timeout) {
  std::lock_guard lk(send_mu_);
  if (closing_) throw TransportError(fmt::format("link to peer {} was closed locally", peer_));
  if (!send_broken_.empty()) throw TransportError(send_broken_);
  const auto deadline = Clock::now() + timeout;
  const auto header = encode_header(type, payload);
  const size_t total = kHeaderBytes + payload.size();
  size_t sent = 0;
  while (sent < total) {
    iovec iov[2];
    int n = 0;
    if (sent < kHeaderBytes) iov[n++] = {const_cast<uint8_t*>(header.data()) + sent, kHeaderBytes - sent};
    const size_t off = sent > kHeaderBytes ? sent - kHeaderBytes : 0;
    if (off < payload.size()) iov[n++] = {const_cast<uint8_t*>(payload.data()) + off, payload.size() - off};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    const ssize_t r = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);  // no SIGPIPE from a closed peer: an error instead
    if (r >= 0) {
      sent += static_cast<size_t>(r);
      continue;
    }
    if (errno == EINTR) continue;
    std::string why;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      why = closing_ ? fmt::format("link to peer {} was closed locally", peer_)
                     : fmt::format("sending to peer {} failed ({} frame, {} of {} bytes sent): {}", peer_,
                                   msg_type_name(type), sent, total, std::strerror(errno));
    else if (!wait_fd(fd_, POLLOUT, deadline))
      why = fmt::format("timed out sending to peer {} ({} frame, {} of {} bytes sent in {} ms)", peer_,
                        msg_type_name(type), sent, total, ms_of(timeout));
    else
      continue;
    // A frame cut short leaves the stream out of step; one not begun leaves it usable.
    if (sent > 0) send_broken_ = why;
    throw TransportError(why);
  }
}

void TcpLink::start_reader(std::function<void(Frame&&)> on_frame, std::function<void(std::string)> on_close,
                           std::chrono::milliseconds frame_timeout) {
  if (reader_started_.exchange(true)) throw std::logic_error("TcpLink::start_reader: already started");
  reader_ = std::thread([this, on_frame = std::move(on_frame), on_close = std::move(on_close), frame_timeout] {
    std::string reason;
    try {
      for (;;) {
        Frame f;
        {
          std::lock_guard lk(receive_mu_);
          f = receive_frame(std::nullopt, std::nullopt, frame_timeout);
        }
        on_frame(std::move(f));
      }
    } catch (const std::exception& e) {
      reason = e.what();  // the link's error, or on_frame's: either way this reader is done
    }
    if (!closing_) on_close(reason);
  });
}

void TcpLink::close() {
  std::lock_guard lk(close_mu_);
  if (closed_) return;
  if (reader_.joinable() && reader_.get_id() == std::this_thread::get_id())
    throw std::logic_error("TcpLink::close called from its own reader thread");
  closed_ = true;
  closing_ = true;
  // shutdown, not close, while other threads may be in poll() on the descriptor: they wake
  // (end of stream, or an error on write) and leave; only then is the descriptor released.
  if (fd_ >= 0) (void)::shutdown(fd_, SHUT_RDWR);
  if (reader_.joinable()) reader_.join();
  std::scoped_lock both(send_mu_, receive_mu_);
  boost::system::error_code ec;
  socket_->sock.close(ec);
  fd_ = -1;
}

// ---- TcpListener ----

TcpListener::TcpListener(const std::string& host, uint16_t port)
    : acceptor_(std::make_unique<Acceptor>()), host_(host) {
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  tcp::endpoint ep;
  if (!ec) {
    ep = tcp::endpoint(address, port);
  } else {
    tcp::resolver resolver(acceptor_->io);
    const auto results = resolver.resolve(host, std::to_string(port), ec);
    if (ec || results.empty())
      throw TransportError(fmt::format("cannot listen on {}: {}", host_port(host, port), ec.message()));
    ep = *results.begin();
  }
  tcp::acceptor& acc = acceptor_->acc;
  if (!ec) acc.open(ep.protocol(), ec);
  if (!ec) acc.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acc.bind(ep, ec);
  if (!ec) acc.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw TransportError(fmt::format("cannot listen on {}: {}", host_port(host, port), ec.message()));
  port_ = acc.local_endpoint().port();
}

TcpListener::~TcpListener() = default;

std::unique_ptr<TcpLink> TcpListener::accept(std::chrono::milliseconds timeout) {
  auto s = std::make_unique<TcpLink::Socket>();
  boost::system::error_code ec;
  bool accepted = false;
  acceptor_->acc.async_accept(s->sock, [&](const boost::system::error_code& e) {
    ec = e;
    accepted = true;
  });
  if (!run_until(acceptor_->io, Clock::now() + timeout, accepted, [&] { acceptor_->acc.cancel(); }))
    throw TransportError(fmt::format("no connection on {} within {} ms", host_port(host_, port_), ms_of(timeout)));
  if (ec) throw TransportError(fmt::format("accepting on {} failed: {}", host_port(host_, port_), ec.message()));
  return std::make_unique<TcpLink>(std::move(s));
}

}  // namespace tandem::transfer
