// Mutual authentication of the two ends of a link with a shared secret (DESIGN.md, stage 4:
// a worker that listens beyond loopback requires it). Each side proves it knows the secret by
// an HMAC-SHA256 over a fresh nonce the other side chose, so the secret never goes on the wire
// and a recorded proof is worth nothing on the next connection. The two directions hash
// different labels, so one side's proof can never be reflected back as the other's.
//   server -> client  Challenge(ns)
//   client -> server  Proof(HMAC(secret, "tandem-client" || ns)), Challenge(nc)
//   server -> client  Proof(HMAC(secret, "tandem-server" || nc))   (only after checking the client's)
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "backend/transfer/tcp_link.h"

namespace tandem::transfer {

using Nonce = std::array<uint8_t, 32>;
using Mac = std::array<uint8_t, 32>;

inline constexpr std::string_view kClientLabel = "tandem-client";
inline constexpr std::string_view kServerLabel = "tandem-server";

// 32 bytes from OpenSSL's CSPRNG; throws std::runtime_error if it has none to give.
Nonce random_nonce();
// HMAC-SHA256(secret, label || nonce).
Mac hmac_sha256(std::string_view secret, std::string_view label, std::span<const uint8_t, 32> nonce);
// In time independent of where they differ (CRYPTO_memcmp).
bool macs_equal(const Mac& a, const Mac& b);

// The shortest shared secret accepted, in bytes of the file without its trailing line ends.
inline constexpr size_t kMinSecretChars = 16;
// The shared secret in a file: its bytes without the line ends that `echo` or an editor leave at
// the end. Throws InputError naming the file when it cannot be read, when its group or others
// may read or write it (refused as ssh refuses such a private key: the message says `chmod 600
// FILE`), or when the secret has fewer than kMinSecretChars bytes (the count given is the
// trimmed one: "0123456789abcde\n" has 15).
std::string read_secret_file(const std::string& path);

// Run on a fresh link before anything else; each completes within the timeout or throws
// TransportError("authentication failed: ..."). The server tells a rejected client so (an
// Error frame) before throwing. An empty secret is refused (std::invalid_argument).
void authenticate_as_server(TcpLink& link, std::string_view secret, std::chrono::milliseconds timeout);
void authenticate_as_client(TcpLink& link, std::string_view secret, std::chrono::milliseconds timeout);

}  // namespace tandem::transfer
