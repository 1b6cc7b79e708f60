// Simulated and measured time: integer nanoseconds everywhere, so event order and
// outputs never depend on floating-point rounding.
#pragma once
#include <cmath>
#include <cstdint>

namespace tandem {

using Time = int64_t;      // absolute, nanoseconds since the start of the run
using Duration = int64_t;  // nanoseconds

constexpr Time kNever = INT64_MAX;

constexpr Duration kNsPerUs = 1'000;
constexpr Duration kNsPerMs = 1'000'000;
constexpr Duration kNsPerS = 1'000'000'000;

// Times a workload may use: up to about 31 years, far inside int64 nanoseconds (292 years),
// so sums of times never overflow. Workload generation refuses anything beyond.
constexpr double kMaxSeconds = 1e9;

inline Duration from_seconds(double s) { return static_cast<Duration>(std::llround(s * 1e9)); }
inline double to_seconds(Duration d) { return static_cast<double>(d) * 1e-9; }
inline double to_ms(Duration d) { return static_cast<double>(d) * 1e-6; }

}  // namespace tandem
