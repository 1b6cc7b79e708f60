#include "sim/worker/worker_faults.h"

#include <fmt/format.h>

#include <sstream>

#include "core/error.h"

namespace tandem {

namespace {

// "0.05" (a probability per push) or "@3:7" (pushes 3 and 7, counted from 1 per connection).
void parse_fault_rate(const std::string& key, const std::string& v, double& p, std::set<int64_t>& at) {
  const auto bad = [&] {
    throw InputError(
        fmt::format("--inject-transfer-faults: {}={}: expected a probability in [0, 1] or @N[:N...] "
                    "(push numbers from 1)",
                    key, v));
  };
  if (!v.empty() && v[0] == '@') {
    std::stringstream ss(v.substr(1));
    std::string n;
    while (std::getline(ss, n, ':')) {
      if (n.empty() || n.size() > 12 || n.find_first_not_of("0123456789") != std::string::npos) bad();
      const int64_t k = std::stoll(n);
      if (k < 1) bad();
      at.insert(k);
    }
    if (at.empty()) bad();
    return;
  }
  size_t used = 0;
  try {
    p = std::stod(v, &used);
  } catch (const std::exception&) {
    bad();
  }
  if (used != v.size() || !(p >= 0 && p <= 1)) bad();
}

}  // namespace

FaultInjection parse_fault_injection(const std::string& spec) {
  FaultInjection f;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      throw InputError(
          fmt::format("--inject-transfer-faults: '{}' is not KEY=VALUE (keys: fail, corrupt, partial, "
                      "seed, delay_ack_ms, delay_step_ms)",
                      item));
    const std::string key = item.substr(0, eq), v = item.substr(eq + 1);
    const auto number = [&](int64_t max) {
      if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos ||
          std::stoull(v) > uint64_t(max))
        throw InputError(fmt::format("--inject-transfer-faults: {}={}: expected an integer in [0, {}]", key, v, max));
      return int64_t(std::stoull(v));
    };
    if (key == "fail")
      parse_fault_rate(key, v, f.fail, f.fail_at);
    else if (key == "corrupt")
      parse_fault_rate(key, v, f.corrupt, f.corrupt_at);
    else if (key == "partial")
      parse_fault_rate(key, v, f.partial, f.partial_at);
    else if (key == "seed")
      f.seed = uint64_t(number(INT64_MAX));
    else if (key == "delay_ack_ms")
      f.delay_ack_ms = number(600'000);
    else if (key == "delay_step_ms")
      f.delay_step_ms = number(600'000);
    else
      throw InputError(
          fmt::format("--inject-transfer-faults: unknown key '{}' (keys: fail, corrupt, partial, seed, "
                      "delay_ack_ms, delay_step_ms)",
                      key));
  }
  if (f.fail + f.corrupt + f.partial > 1)
    throw InputError(fmt::format("--inject-transfer-faults: fail + corrupt + partial = {} exceeds 1",
                                 f.fail + f.corrupt + f.partial));
  return f;
}

std::string describe(const FaultInjection& f) {
  std::string s;
  const auto rate = [&](const char* name, double p, const std::set<int64_t>& at) {
    if (p > 0) s += fmt::format("{}{} {}", s.empty() ? "" : ", ", name, p);
    for (int64_t k : at) s += fmt::format("{}{} at push {}", s.empty() ? "" : ", ", name, k);
  };
  rate("fail", f.fail, f.fail_at);
  rate("corrupt", f.corrupt, f.corrupt_at);
  rate("partial", f.partial, f.partial_at);
  if (f.fail + f.corrupt + f.partial > 0) s += fmt::format(", seed {}", f.seed);
  if (f.delay_ack_ms > 0) s += fmt::format("{}acks delayed {} ms", s.empty() ? "" : ", ", f.delay_ack_ms);
  if (f.delay_step_ms > 0) s += fmt::format("{}steps delayed {} ms", s.empty() ? "" : ", ", f.delay_step_ms);
  return s;
}

bool FaultInjection::any() const {
  return fail + corrupt + partial > 0 || !fail_at.empty() || !corrupt_at.empty() || !partial_at.empty() ||
         delay_ack_ms > 0 || delay_step_ms > 0;
}

}  // namespace tandem
