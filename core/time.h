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
// The run's clock: a simulated run that would pass this stops with an error instead of
// wrapping. 4e9 s (about 127 years) leaves room for one more time of either kind, so
// `time + time` and `time + duration` never overflow before the check.
constexpr Time kMaxTime = Time(4'000'000'000) * kNsPerS;
constexpr double kMaxTimeSeconds = 4e9;
// The longest step a cost model may charge (the same bound as workload times).
constexpr double kMaxStepSeconds = kMaxSeconds;

inline Duration from_seconds(double s) { return static_cast<Duration>(std::llround(s * 1e9)); }
inline double to_seconds(Duration d) { return static_cast<double>(d) * 1e-9; }
inline double to_ms(Duration d) { return static_cast<double>(d) * 1e-6; }

}  // namespace tandem
