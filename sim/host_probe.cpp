#include "sim/host_probe.h"

#include <cstdio>
#include <ctime>
#include <fstream>

#include "sim/version.h"

namespace tandem {

std::string git_version() { return TANDEM_CODE_VERSION; }

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

std::string gpu_name() {
  std::string v;
  if (FILE* f =
          popen("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1", "r")) {
    char buf[256];
    while (fgets(buf, sizeof buf, f)) v += buf;
    pclose(f);
  }
  while (!v.empty() && (v.back() == '\n' || v.back() == '\r')) v.pop_back();
  return v.empty() ? "unknown GPU" : v;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

}  // namespace tandem
