// Deterministic random numbers. The standard library's distributions are
// implementation-defined, so a workload's requests would differ between standard
// libraries; these are written out so the same seed gives the same run everywhere.
#pragma once
#include <cmath>
#include <cstdint>

namespace tandem {

// splitmix64: used to seed and to hash (token ids, stream derivation).
constexpr uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

constexpr uint64_t hash_combine(uint64_t a, uint64_t b) { return mix64(a ^ mix64(b)); }

// xoshiro256** (Blackman & Vigna), seeded through splitmix64.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t x = seed;
    for (auto& w : s_) {
      x += 0x9e3779b97f4a7c15ULL;
      w = mix64(x);
    }
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform in (0, 1]: safe for log().
  double uniform_pos() { return 1.0 - uniform(); }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [lo, hi] (inclusive), unbiased by rejection.
  int64_t uniform_int(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    if (span == 0) return static_cast<int64_t>(next());
    const uint64_t limit = UINT64_MAX - UINT64_MAX % span;
    uint64_t v;
    do {
      v = next();
    } while (v >= limit);
    return lo + static_cast<int64_t>(v % span);
  }
  double exponential(double rate) { return -std::log(uniform_pos()) / rate; }
  double normal() {  // Box-Muller; the second value is dropped to keep the stream simple
    const double u1 = uniform_pos(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }
  // Gamma(shape k, scale 1) by Marsaglia & Tsang; k < 1 through the boost k+1 trick.
  double gamma(double k) {
    if (k < 1.0) return gamma(k + 1.0) * std::pow(uniform_pos(), 1.0 / k);
    const double d = k - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
    for (;;) {
      double x, v;
      do {
        x = normal();
        v = 1.0 + c * x;
      } while (v <= 0.0);
      v = v * v * v;
      const double u = uniform_pos();
      if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v;
    }
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace tandem
