// The decode worker's addresses, as both sides read them: HOST:PORT, and which hosts are this
// machine (a secret is required off loopback).
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <utility>

#include "core/error.h"

namespace tandem {

inline bool is_loopback(const std::string& host) { return host == "127.0.0.1" || host == "localhost" || host == "::1"; }

// HOST:PORT, already checked by the workload parser (or the worker's options).
inline std::pair<std::string, uint16_t> split_host_port(const std::string& s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0) throw InputError(fmt::format("'{}' is not HOST:PORT", s));
  const std::string port = s.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) > 65535)
    throw InputError(fmt::format("'{}' is not HOST:PORT (port 0-65535)", s));
  return {s.substr(0, colon), uint16_t(std::stoi(port))};
}

}  // namespace tandem
