#include "sim/host_probe.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
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

CpuSample cpu_sample() {
  CpuSample c;
  std::ifstream in("/proc/stat");
  std::string cpu;
  // user nice system idle iowait irq softirq steal (guest time is already inside user).
  double f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (!(in >> cpu) || cpu != "cpu") return c;
  for (double& x : f)
    if (!(in >> x)) return c;
  const double tick = double(sysconf(_SC_CLK_TCK) > 0 ? sysconf(_SC_CLK_TCK) : 100);
  c.total_s = (f[0] + f[1] + f[2] + f[3] + f[4] + f[5] + f[6] + f[7]) / tick;
  c.busy_s = (f[0] + f[1] + f[2] + f[5] + f[6]) / tick;
  c.steal_s = f[7] / tick;
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return c;
  c.own_s = double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  c.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  c.valid = true;
  return c;
}

CpuShares cpu_shares(const CpuSample& a, const CpuSample& b) {
  CpuShares s;
  const double total = b.total_s - a.total_s;
  if (!a.valid || !b.valid || total <= 0) return s;
  // /proc/stat counts in clock ticks, rusage in microseconds: clamp the difference at 0.
  s.others = std::clamp(((b.busy_s - a.busy_s) - (b.own_s - a.own_s)) / total, 0.0, 1.0);
  s.steal = std::clamp((b.steal_s - a.steal_s) / total, 0.0, 1.0);
  if (b.wall_s > a.wall_s) s.own_cores = std::max(0.0, (b.own_s - a.own_s) / (b.wall_s - a.wall_s));
  return s;
}

double load_average() {
  std::ifstream in("/proc/loadavg");
  double l = -1;
  if (!(in >> l)) return -1;
  return l;
}

}  // namespace tandem
