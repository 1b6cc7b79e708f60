// What calibrate records about where a profile was measured.
#pragma once
#include <string>

namespace tandem {

std::string git_version();  // the build's code version, not the current directory's
std::string cpu_name();     // /proc/cpuinfo's model name
std::string gpu_name();     // nvidia-smi's name and driver of GPU 0, or "unknown GPU"
std::string utc_now();      // ISO 8601, seconds

}  // namespace tandem
