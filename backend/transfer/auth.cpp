#include "backend/transfer/auth.h"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"

namespace tandem::transfer {

namespace {

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds left(Clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(0), std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()));
}

// The next frame, which must be `want`; an Error frame carries the peer's reason.
Frame expect(TcpLink& link, MsgType want, Clock::time_point deadline) {
  Frame f = link.receive(left(deadline));
  if (f.type == MsgType::Error)
    throw TransportError(fmt::format("peer {} refused: {}", link.peer(), decode_error(f.payload).message));
  if (f.type != want)
    throw TransportError(
        fmt::format("expected {} from peer {}, got {}", msg_type_name(want), link.peer(), msg_type_name(f.type)));
  return f;
}

// Runs one side of the handshake; whatever went wrong (a bad proof, a malformed or unexpected
// frame, a timeout, a closed link) comes out as one TransportError.
template <class Body>
void handshake(std::string_view secret, Body body) {
  if (secret.empty()) throw std::invalid_argument("authentication needs a non-empty shared secret");
  try {
    body();
  } catch (const TransportError& e) {
    throw TransportError(std::string("authentication failed: ") + e.what());
  } catch (const WireError& e) {
    throw TransportError(std::string("authentication failed: ") + e.what());
  }
}

}  // namespace

std::string read_secret_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw InputError(fmt::format("{}: cannot read the shared secret", path));
  if (!S_ISREG(st.st_mode)) throw InputError(fmt::format("{}: the shared secret is not a regular file", path));
  if ((st.st_mode & 077) != 0)
    throw InputError(
        fmt::format("{}: the shared secret may be read or written by group or others (mode {:04o}); run chmod 600 {}",
                    path, st.st_mode & 07777, path));
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InputError(fmt::format("{}: cannot read the shared secret", path));
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (s.size() < kMinSecretChars)
    throw InputError(fmt::format("{}: the shared secret has {} characters; it must have at least {}", path, s.size(),
                                 kMinSecretChars));
  return s;
}

Nonce random_nonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1)
    throw std::runtime_error("random_nonce: OpenSSL's RAND_bytes failed (no entropy?)");
  return n;
}

Mac hmac_sha256(std::string_view secret, std::string_view label, std::span<const uint8_t, 32> nonce) {
  if (secret.size() > INT_MAX) throw std::invalid_argument("hmac_sha256: secret too long");
  std::vector<uint8_t> msg(label.begin(), label.end());
  msg.insert(msg.end(), nonce.begin(), nonce.end());
  static const uint8_t kNoKey = 0;  // OpenSSL wants a valid pointer even for an empty key
  const void* key = secret.empty() ? static_cast<const void*>(&kNoKey) : secret.data();
  Mac out{};
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key, static_cast<int>(secret.size()), msg.data(), msg.size(), out.data(), &len) ||
      len != out.size())
    throw std::runtime_error("hmac_sha256: OpenSSL's HMAC failed");
  return out;
}

bool macs_equal(const Mac& a, const Mac& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

void authenticate_as_server(TcpLink& link, std::string_view secret, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  handshake(secret, [&] {
    const Nonce ns = random_nonce();
    link.send(ChallengeMsg{ns});
    const ProofMsg proof = decode_proof(expect(link, MsgType::Proof, deadline).payload);
    if (!macs_equal(proof.mac, hmac_sha256(secret, kClientLabel, ns))) {
      const std::string why = "the client's proof does not match the shared secret";
      try {
        link.send(ErrorMsg{why});
      } catch (const TransportError&) {}  // the client learns it from the closed link instead
      throw TransportError(why);
    }
    // Only a client that proved itself gets a proof back: the server is no oracle for others.
    const ChallengeMsg challenge = decode_challenge(expect(link, MsgType::Challenge, deadline).payload);
    link.send(ProofMsg{hmac_sha256(secret, kServerLabel, challenge.nonce)});
  });
}

void authenticate_as_client(TcpLink& link, std::string_view secret, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  handshake(secret, [&] {
    const ChallengeMsg challenge = decode_challenge(expect(link, MsgType::Challenge, deadline).payload);
    link.send(ProofMsg{hmac_sha256(secret, kClientLabel, challenge.nonce)});
    const Nonce nc = random_nonce();
    link.send(ChallengeMsg{nc});
    const ProofMsg proof = decode_proof(expect(link, MsgType::Proof, deadline).payload);
    if (!macs_equal(proof.mac, hmac_sha256(secret, kServerLabel, nc)))
      throw TransportError("the server's proof does not match the shared secret");
  });
}

}  // namespace tandem::transfer
