// The channel's TCP link (backend/transfer/tcp_link.h) over loopback: a 64 MiB frame arrives
// whole and checked; every way a peer can fail (silence, closing, a half frame, a corrupt or
// oversized frame, not reading) ends in TransportError within its timeout, never a hang or a
// crash. The time bounds asserted here are correctness bounds (an error comes, and before a
// generous limit), not speed.
#include <doctest/doctest.h>

#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/transfer/tcp_link.h"
#include "backend/transfer/wire.h"

using namespace tandem::transfer;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;
using Bytes = std::vector<uint8_t>;

struct Pair {
  std::unique_ptr<TcpLink> server, client;
};

// A connected pair over loopback (the kernel completes the connection before accept).
Pair connect_pair() {
  TcpListener listener("127.0.0.1", 0);
  auto client = TcpLink::connect("127.0.0.1", listener.port(), 5s);
  auto server = listener.accept(5s);
  return {std::move(server), std::move(client)};
}

// A peer that writes raw bytes, whatever a TcpLink would refuse to send.
struct RawPeer {
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket sock{io};
  explicit RawPeer(uint16_t port) { sock.connect({boost::asio::ip::make_address("127.0.0.1"), port}); }
  void write(const Bytes& b) { boost::asio::write(sock, boost::asio::buffer(b)); }
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string transport_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const TransportError& e) {
    return e.what();
  }
  return "(no TransportError)";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("a 64 MiB KvPush crosses loopback whole and checked") {
  Pair p = connect_pair();
  CHECK(contains(p.server->peer(), "127.0.0.1:"));
  KvPushMsg m;
  m.ticket = 11;
  m.request = 3;
  m.num_tokens = 4096 * 16;
  constexpr int64_t kBlockBytes = 16384;
  for (int32_t b = 0; b < 4096; ++b) m.dst_blocks.push_back(4095 - b);
  m.payload.resize(size_t(4096 * kBlockBytes));
  for (size_t i = 0; i < m.payload.size(); ++i) m.payload[i] = uint8_t((i * 2654435761u) >> 13);
  m.block_checksums = block_checksums(m.payload, kBlockBytes);
  const Bytes payload = encode(m);
  REQUIRE(payload.size() > (size_t{64} << 20));

  std::exception_ptr send_error;
  std::thread sender([&] {
    try {
      p.client->send(MsgType::KvPush, payload);
    } catch (...) {
      send_error = std::current_exception();
    }
  });
  Frame f;
  CHECK_NOTHROW(f = p.server->receive(60s));
  sender.join();
  CHECK_FALSE(send_error);
  CHECK(f.type == MsgType::KvPush);
  CHECK(f.payload == payload);
  const KvPushMsg got = decode_kv_push(f.payload);
  CHECK(got == m);
  CHECK_NOTHROW(check_kv_push(got, 4096, kBlockBytes, 16));
}

TEST_CASE("a silent peer: receive times out within its bound, and the link stays usable") {
  Pair p = connect_pair();
  const auto t0 = Clock::now();
  const std::string err = transport_error([&] { (void)p.server->receive(200ms); });
  const double elapsed = seconds_since(t0);
  CHECK(err == "no frame from peer " + p.server->peer() + " within 200 ms");
  CHECK(elapsed >= 0.2);
  CHECK(elapsed < 5.0);
  // Nothing of a frame had arrived: the stream is still in step.
  p.client->send(ByeMsg{});
  CHECK(p.server->receive(5s).type == MsgType::Bye);
}

TEST_CASE("the reader hands over frames and reports the peer's close once") {
  Pair p = connect_pair();
  std::atomic<int> frames{0};
  std::atomic<int> closes{0};
  std::promise<std::string> closed;
  p.server->start_reader([&](Frame&& f) { frames += f.type == MsgType::StepReply; },
                         [&](std::string reason) {
                           if (closes++ == 0) closed.set_value(reason);
                         });
  CHECK_THROWS_AS((void)p.server->receive(10ms), std::logic_error);  // the reader owns receiving
  for (int i = 0; i < 3; ++i) p.client->send(StepReplyMsg{uint64_t(i), 5, {1}, ""});
  p.client->close();
  auto f = closed.get_future();
  REQUIRE(f.wait_for(5s) == std::future_status::ready);
  CHECK(f.get() == "peer " + p.server->peer() + " closed the connection");
  p.server->close();
  CHECK(frames == 3);
  CHECK(closes == 1);
}

TEST_CASE("close() stops an idle reader without calling on_close") {
  Pair p = connect_pair();
  std::atomic<int> closes{0};
  p.server->start_reader([](Frame&&) {}, [&](std::string) { ++closes; });
  std::this_thread::sleep_for(50ms);  // the reader is waiting for a first byte, without a deadline
  const auto t0 = Clock::now();
  p.server->close();
  p.server->close();  // idempotent
  CHECK(seconds_since(t0) < 5.0);
  CHECK(closes == 0);
  CHECK(contains(transport_error([&] { p.server->send(ByeMsg{}); }), "closed locally"));
  p.server.reset();  // the destructor after close()
  Pair q = connect_pair();
  q.server->start_reader([](Frame&&) {}, [](std::string) {});
  q.server.reset();  // the destructor with the reader running
}

TEST_CASE("connecting to a closed port fails within its timeout; connect waits for a late listener") {
  uint16_t port = 0;
  { port = TcpListener("127.0.0.1", 0).port(); }  // free again: nothing listens there
  const auto t0 = Clock::now();
  const std::string err = transport_error([&] { (void)TcpLink::connect("127.0.0.1", port, 300ms); });
  CHECK(seconds_since(t0) < 5.0);
  CHECK(contains(err, "cannot connect to 127.0.0.1:" + std::to_string(port) + " within 300 ms"));

  // The peer may still be starting: connect retries until it listens.
  std::unique_ptr<TcpListener> late;
  std::thread starter([&] {
    std::this_thread::sleep_for(300ms);
    late = std::make_unique<TcpListener>("127.0.0.1", port);
  });
  std::unique_ptr<TcpLink> link;
  CHECK_NOTHROW(link = TcpLink::connect("127.0.0.1", port, 10s));
  starter.join();
  CHECK(link != nullptr);
}

TEST_CASE("connecting to a port nobody listens on fails fast, not at its timeout (#35, 5)") {
  uint16_t port = 0;
  { port = TcpListener("127.0.0.1", 0).port(); }  // free again: every attempt is refused
  const auto t0 = Clock::now();
  const std::string err = transport_error([&] { (void)TcpLink::connect("127.0.0.1", port, 30s); });
  CHECK(seconds_since(t0) < 5.0);  // about 20 tries 50 ms apart, not the 30 s timeout
  CHECK(contains(err, "cannot connect to 127.0.0.1:" + std::to_string(port) + ": connection refused 20 times"));
  CHECK(contains(err, "nothing listens there"));
}

TEST_CASE("accept times out when nobody connects") {
  TcpListener listener("127.0.0.1", 0);
  const auto t0 = Clock::now();
  const std::string err = transport_error([&] { (void)listener.accept(100ms); });
  CHECK(seconds_since(t0) < 5.0);
  CHECK(err == "no connection on 127.0.0.1:" + std::to_string(listener.port()) + " within 100 ms");
  // The listener still works after a timeout.
  auto client = TcpLink::connect("127.0.0.1", listener.port(), 5s);
  CHECK(listener.accept(5s) != nullptr);
}

TEST_CASE("a corrupt frame on the raw socket is reported as corrupt, and the link refuses more") {
  TcpListener listener("127.0.0.1", 0);
  RawPeer raw(listener.port());
  auto link = listener.accept(5s);
  const Bytes payload = encode(KvAckMsg{1, KvAckStatus::Written, 1, 2, "some text to corrupt"});
  Bytes frame = encode_frame(MsgType::KvAck, payload);
  raw.write(frame);
  CHECK(link->receive(5s).payload == payload);
  frame[kHeaderBytes + 12] ^= 0x04;
  raw.write(frame);
  const std::string err = transport_error([&] { (void)link->receive(5s); });
  CHECK(contains(err, "corrupt frame from peer " + link->peer() + ": frame.checksum: mismatch"));
  // Out of step now: the next receive fails with the same reason, without reading.
  CHECK(transport_error([&] { (void)link->receive(5s); }) == err);

  // Through the reader: one good frame, then a bad header.
  RawPeer raw2(listener.port());
  auto link2 = listener.accept(5s);
  std::atomic<int> frames{0};
  std::promise<std::string> closed;
  link2->start_reader([&](Frame&&) { ++frames; }, [&](std::string r) { closed.set_value(r); });
  Bytes bad = encode_frame(MsgType::Bye, {});
  raw2.write(bad);
  bad[0] = 'X';
  raw2.write(bad);
  auto f = closed.get_future();
  REQUIRE(f.wait_for(5s) == std::future_status::ready);
  CHECK(contains(f.get(), "corrupt frame from peer " + link2->peer() + ": frame.magic"));
  CHECK(frames == 1);
}

TEST_CASE("an oversized frame is refused from its header, before any payload arrives") {
  TcpListener listener("127.0.0.1", 0);
  RawPeer raw(listener.port());
  auto link = listener.accept(5s);
  link->set_max_payload(1 << 20);
  WireWriter h;
  h.u32(kFrameMagic);
  h.u16(uint16_t(MsgType::KvPush));
  h.u16(0);
  h.u64(uint64_t{1} << 30);
  h.u64(0);
  raw.write(h.buffer());  // the header alone: a receiver that waited for the payload would time out
  const auto t0 = Clock::now();
  const std::string err = transport_error([&] { (void)link->receive(10s); });
  CHECK(seconds_since(t0) < 5.0);
  CHECK(contains(err, "frame.payload_len: 1073741824 exceeds the 1048576 allowed"));
}

TEST_CASE("half a frame, then silence: a timeout that ends the link") {
  TcpListener listener("127.0.0.1", 0);
  RawPeer raw(listener.port());
  auto link = listener.accept(5s);
  const Bytes frame = encode_frame(MsgType::Error, encode(ErrorMsg{std::string(100, 'e')}));
  raw.write(Bytes(frame.begin(), frame.begin() + 40));
  const auto t0 = Clock::now();
  const std::string err = transport_error([&] { (void)link->receive(200ms); });
  CHECK(seconds_since(t0) < 5.0);
  CHECK(err ==
        "timed out receiving a frame from peer " + link->peer() + ": 40 of " + std::to_string(frame.size()) + " bytes");
  raw.write(Bytes(frame.begin() + 40, frame.end()));  // too late: the link is out of step
  CHECK(transport_error([&] { (void)link->receive(1s); }) == err);

  // The peer closing part-way through a frame.
  RawPeer raw2(listener.port());
  auto link2 = listener.accept(5s);
  raw2.write(Bytes(frame.begin(), frame.begin() + 30));
  raw2.sock.close();
  CHECK(transport_error([&] { (void)link2->receive(5s); }) ==
        "peer " + link2->peer() + " closed the connection in the middle of a frame (30 of " +
            std::to_string(frame.size()) + " bytes)");
}

TEST_CASE("sends from several threads arrive as whole frames") {
  Pair p = connect_pair();
  constexpr int kThreads = 4, kEach = 25;
  std::vector<std::thread> senders;
  std::atomic<int> send_errors{0};
  for (int t = 0; t < kThreads; ++t)
    senders.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        Bytes b(size_t(8 + (t * 7919 + i * 104729) % 300000), uint8_t(t * 31 + i));
        b[0] = uint8_t(t);
        b[1] = uint8_t(i);
        try {
          p.client->send(MsgType::Error, b);
        } catch (const TransportError&) {
          ++send_errors;
        }
      }
    });
  std::vector<int> next(kThreads, 0);
  int bad = 0;
  std::string receive_err;
  for (int n = 0; n < kThreads * kEach && receive_err.empty(); ++n) {
    try {
      const Frame f = p.server->receive(30s);
      const int t = f.payload[0], i = f.payload[1];
      if (t >= kThreads || i != next[size_t(t)]++) ++bad;
      for (size_t j = 2; j < f.payload.size(); ++j) bad += f.payload[j] != uint8_t(t * 31 + i);
    } catch (const TransportError& e) {  // interleaved frames read as corrupt
      receive_err = e.what();
      p.server->close();  // the senders fail instead of waiting for a reader
    }
  }
  for (std::thread& s : senders) s.join();
  CHECK(receive_err == "");
  CHECK(send_errors == 0);
  CHECK(bad == 0);
  CHECK(next == std::vector<int>(kThreads, kEach));
}

TEST_CASE("a peer that does not read: send times out; a closed peer: send fails") {
  Pair p = connect_pair();
  p.client->set_write_timeout(200ms);
  const Bytes big(size_t{64} << 20, 7);  // more than loopback's socket buffers hold
  const auto t0 = Clock::now();
  const std::string err = transport_error([&] { p.client->send(MsgType::KvPush, big); });
  CHECK(seconds_since(t0) < 5.0);
  CHECK(contains(err, "timed out sending to peer " + p.client->peer() + " (KvPush frame"));
  // Part of that frame went out: the stream is out of step, and further sends refuse.
  CHECK(transport_error([&] { p.client->send(ByeMsg{}); }) == err);

  Pair q = connect_pair();
  q.server->close();
  // The first sends may still land in the socket buffer; one soon meets the reset.
  std::string closed_err = "(no TransportError)";
  int sends = 0;
  for (; sends < 100 && closed_err == "(no TransportError)"; ++sends)
    closed_err = transport_error([&] { q.client->send(MsgType::Error, Bytes(1 << 16, 1)); });
  CHECK(sends < 100);
  CHECK(contains(closed_err, "sending to peer " + q.client->peer() + " failed (Error frame"));
}
