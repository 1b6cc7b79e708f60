// One TCP connection carrying frames (wire.h) between the prefill and decode processes.
// Boost.Asio resolves, connects and accepts (each bounded by a deadline on a private
// io_context); reads and writes poll the native socket against a deadline, so that a send on
// one thread and a receive on another never share an io_context. A dead or silent peer gives
// TransportError within the timeout, never a hang. A frame is taken apart only after its
// header is checked (magic, type, flags, length <= max_payload) and is returned only when its
// checksum matches; a corrupt or timed-out partial frame leaves the stream out of step, so
// the link refuses further receives (DESIGN.md: a peer that lies ends its connection).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>

#include "backend/transfer/wire.h"

namespace tandem::transfer {

// A connection that failed: refused, timed out, closed by the peer, or fed a corrupt frame.
class TransportError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class TcpLink {
 public:
  struct Socket;  // the Asio socket and its io_context (tcp_link.cpp)
  explicit TcpLink(std::unique_ptr<Socket> socket);
  ~TcpLink();
  TcpLink(const TcpLink&) = delete;
  TcpLink& operator=(const TcpLink&) = delete;

  // Retries (every 50 ms) until the timeout, as the peer may still be starting; then throws
  // TransportError naming host:port and the last error.
  static std::unique_ptr<TcpLink> connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout);

  // One frame, whole, within the write timeout (set_write_timeout). Thread-safe: concurrent
  // sends do not interleave. Throws TransportError; after one cut a frame short, every later
  // send throws too (the stream is out of step).
  void send(MsgType type, std::span<const uint8_t> payload);
  // The same within `timeout` instead of the write timeout (a heartbeat, a goodbye).
  void send(MsgType type, std::span<const uint8_t> payload, std::chrono::milliseconds timeout);
  template <class Msg>
  void send(const Msg& m) {
    send(Msg::kType, encode(m));
  }
  // One whole frame within the timeout. Throws TransportError on a timeout, the peer closing,
  // or a corrupt frame (the WireError's message included). A timeout before the frame's first
  // byte leaves the link usable; any other failure ends it. Not while the reader runs.
  Frame receive(std::chrono::milliseconds timeout);

  // A thread that receives frame after frame and hands each to on_frame. An idle link is
  // normal (the reader waits for a frame's first byte as long as it takes; the peer's close or
  // TCP keepalive ends a dead one); once a frame has begun, it must be whole within
  // frame_timeout. On any error (an exception from on_frame included) it calls on_close once
  // with the reason and stops; after close() stopped it, on_close is not called. Both run on
  // the reader thread and must not call close() or destroy the link.
  void start_reader(std::function<void(Frame&&)> on_frame, std::function<void(std::string reason)> on_close,
                    std::chrono::milliseconds frame_timeout = std::chrono::seconds(60));
  // Idempotent; wakes and joins the reader; safe from the destructor.
  void close();

  std::string peer() const { return peer_; }
  // Frames announcing more payload than this are refused before anything is allocated.
  void set_max_payload(uint64_t bytes) { max_payload_ = bytes; }
  uint64_t max_payload() const { return max_payload_; }
  // The bound on one send (default 30 s).
  void set_write_timeout(std::chrono::milliseconds t) { write_timeout_ = t; }

 private:
  using Clock = std::chrono::steady_clock;
  enum class Io { Ok, Timeout, Closed, Failed };
  // Reads exactly out.size() bytes by the deadline (none: as long as it takes); `got` counts
  // the bytes read so far, also when it fails.
  Io read_exact(std::span<uint8_t> out, std::optional<Clock::time_point> deadline, size_t& got, int& err);
  // first_byte_deadline: none waits as long as it takes. The whole frame is due by
  // frame_deadline, or else frame_timeout after its first byte.
  Frame receive_frame(std::optional<Clock::time_point> first_byte_deadline,
                      std::optional<Clock::time_point> frame_deadline, std::chrono::milliseconds frame_timeout);

  std::unique_ptr<Socket> socket_;
  int fd_ = -1;
  std::string peer_;
  std::atomic<uint64_t> max_payload_{kDefaultMaxPayload};
  std::atomic<std::chrono::milliseconds> write_timeout_{std::chrono::seconds(30)};
  std::mutex send_mu_;
  std::mutex receive_mu_;
  std::atomic<bool> closing_{false};
  std::mutex close_mu_;
  bool closed_ = false;  // under close_mu_
  // Under receive_mu_ / send_mu_: set when a receive or a send failed part-way through a frame;
  // the stream is then out of step and every later receive or send fails with the reason.
  std::string receive_broken_;
  std::string send_broken_;
  std::atomic<bool> reader_started_{false};
  std::thread reader_;
};

class TcpListener {
 public:
  // Binds host:port (port 0: an ephemeral port, see port()) and listens.
  TcpListener(const std::string& host, uint16_t port);
  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;
  uint16_t port() const { return port_; }
  // The next connection; throws TransportError if none comes within the timeout.
  std::unique_ptr<TcpLink> accept(std::chrono::milliseconds timeout);

 private:
  struct Acceptor;
  std::unique_ptr<Acceptor> acceptor_;
  std::string host_;
  uint16_t port_ = 0;
};

}  // namespace tandem::transfer
