// The link's mutual authentication (backend/transfer/auth.h): the HMAC against an independent
// reference, and the handshake over loopback: the same secret passes both ways; a different
// secret, a proof for another nonce, a server that cannot prove itself and a silent peer all
// fail with "authentication failed" on the side that notices, within the timeout.
#include <doctest/doctest.h>

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <thread>

#include "backend/transfer/auth.h"
#include "backend/transfer/tcp_link.h"

using namespace tandem::transfer;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

struct Pair {
  std::unique_ptr<TcpLink> server, client;
};

Pair connect_pair() {
  TcpListener listener("127.0.0.1", 0);
  auto client = TcpLink::connect("127.0.0.1", listener.port(), 5s);
  auto server = listener.accept(5s);
  return {std::move(server), std::move(client)};
}

// Runs `server_side` on a thread and `client_side` here; returns each side's error ("" if none).
template <class S, class C>
std::pair<std::string, std::string> run_both(S server_side, C client_side) {
  std::string server_err, client_err;
  std::thread t([&] {
    try {
      server_side();
    } catch (const TransportError& e) {
      server_err = e.what();
    }
  });
  try {
    client_side();
  } catch (const TransportError& e) {
    client_err = e.what();
  }
  t.join();
  return {server_err, client_err};
}

std::string hex(const Mac& m) {
  std::string s;
  for (uint8_t b : m) s += "0123456789abcdef"[b >> 4], s += "0123456789abcdef"[b & 15];
  return s;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

TEST_CASE("hmac_sha256 matches a reference (Python's hmac) and the labels differ") {
  Nonce n{};
  for (size_t i = 0; i < n.size(); ++i) n[i] = uint8_t(i);
  // python3: hmac.new(b'shared secret', b'tandem-client' + bytes(range(32)), hashlib.sha256).hexdigest()
  CHECK(hex(hmac_sha256("shared secret", kClientLabel, n)) ==
        "46bc7c04a5ce4e57599bede5f4d72e41282c31b6a5c9af823bd0dfb08992e312");
  CHECK(hex(hmac_sha256("shared secret", kServerLabel, n)) ==
        "74dad4e142a7edc14cd249482afc319d2f731559823ab9a6276d5ce733cf63b3");
  const Mac a = hmac_sha256("k", kClientLabel, n);
  Mac b = a;
  CHECK(macs_equal(a, b));
  b[31] ^= 1;
  CHECK_FALSE(macs_equal(a, b));
  CHECK(random_nonce() != random_nonce());
}

TEST_CASE("the same secret authenticates both sides; the link carries on") {
  Pair p = connect_pair();
  const auto [server_err, client_err] = run_both([&] { authenticate_as_server(*p.server, "s3cret", 5s); },
                                                 [&] { authenticate_as_client(*p.client, "s3cret", 5s); });
  CHECK(server_err == "");
  CHECK(client_err == "");
  p.client->send(HelloMsg{kProtocolVersion, "x: 1", {}});
  CHECK(decode_hello(p.server->receive(5s).payload).workload_yaml == "x: 1");
}

TEST_CASE("different secrets fail on both sides") {
  Pair p = connect_pair();
  const auto [server_err, client_err] = run_both([&] { authenticate_as_server(*p.server, "one secret", 5s); },
                                                 [&] { authenticate_as_client(*p.client, "another secret", 5s); });
  CHECK(server_err == "authentication failed: the client's proof does not match the shared secret");
  CHECK(starts_with(client_err, "authentication failed: peer " + p.client->peer() + " refused: "));
}

TEST_CASE("a server that does not know the secret is caught by the client") {
  Pair p = connect_pair();
  // A rogue server: accepts any proof, answers the client's challenge with a guess.
  const auto [server_err, client_err] = run_both(
      [&] {
        p.server->send(ChallengeMsg{random_nonce()});
        (void)decode_proof(p.server->receive(5s).payload);
        const ChallengeMsg c = decode_challenge(p.server->receive(5s).payload);
        p.server->send(ProofMsg{hmac_sha256("a guess", kServerLabel, c.nonce)});
      },
      [&] { authenticate_as_client(*p.client, "s3cret", 5s); });
  CHECK(server_err == "");
  CHECK(client_err == "authentication failed: the server's proof does not match the shared secret");
}

TEST_CASE("a proof for another nonce, or a reflected one, is refused") {
  Pair p = connect_pair();
  // A client that knows the secret's proof for some other nonce (a recorded handshake).
  const auto [server_err, client_err] =
      run_both([&] { authenticate_as_server(*p.server, "s3cret", 5s); },
               [&] {
                 (void)p.client->receive(5s);  // the server's challenge, ignored
                 p.client->send(ProofMsg{hmac_sha256("s3cret", kClientLabel, Nonce{})});
                 (void)p.client->receive(5s);  // the server's Error
               });
  CHECK(server_err == "authentication failed: the client's proof does not match the shared secret");

  // A proof with the server's own label over the server's nonce.
  Pair q = connect_pair();
  const auto [server_err2, client_err2] =
      run_both([&] { authenticate_as_server(*q.server, "s3cret", 5s); },
               [&] {
                 const ChallengeMsg c = decode_challenge(q.client->receive(5s).payload);
                 q.client->send(ProofMsg{hmac_sha256("s3cret", kServerLabel, c.nonce)});
               });
  CHECK(server_err2 == "authentication failed: the client's proof does not match the shared secret");
}

TEST_CASE("a silent or wrong peer fails the handshake within its timeout") {
  Pair p = connect_pair();
  const auto t0 = Clock::now();
  std::string err;
  try {
    authenticate_as_server(*p.server, "s3cret", 200ms);
  } catch (const TransportError& e) {
    err = e.what();
  }
  CHECK(std::chrono::duration<double>(Clock::now() - t0).count() < 5.0);
  CHECK(starts_with(err, "authentication failed: no frame from peer"));

  // A server that sends anything but its challenge first.
  Pair q = connect_pair();
  q.server->send(HelloMsg{});
  try {
    authenticate_as_client(*q.client, "s3cret", 5s);
    err.clear();
  } catch (const TransportError& e) {
    err = e.what();
  }
  CHECK(err == "authentication failed: expected Challenge from peer " + q.client->peer() + ", got Hello");
  CHECK_THROWS_AS(authenticate_as_client(*q.client, "", 5s), std::invalid_argument);
}
