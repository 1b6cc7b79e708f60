// What calibrate records about where a profile was measured.
#pragma once
#include <string>

namespace tandem {

std::string git_version();  // the build's code version, not the current directory's
std::string cpu_name();     // /proc/cpuinfo's model name
std::string gpu_name();     // nvidia-smi's name and driver of GPU 0, or "unknown GPU"
std::string utc_now();      // ISO 8601, seconds

// Contention from other work, for calibrate's record of the conditions it measured under.
// A sample of the machine's CPU time (/proc/stat, all CPUs) and this process's own (getrusage);
// two samples give the share of the machine that other processes used, and the share stolen by
// a hypervisor, in between. Unreadable /proc: valid is false and the shares are -1.
struct CpuSample {
  bool valid = false;
  double busy_s = 0, total_s = 0, steal_s = 0, own_s = 0, wall_s = 0;
};
CpuSample cpu_sample();
struct CpuShares {
  double others = -1, steal = -1;  // fractions of all the machine's CPU time over the interval
  double own_cores = -1;           // this process's CPU time over the wall time: cores it had on average
};
CpuShares cpu_shares(const CpuSample& from, const CpuSample& to);
double load_average();  // the 1-minute load average, -1 when unknown

}  // namespace tandem
