#include "sim/base/host_probe.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

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

namespace {
double rusage_s(int who) {
  rusage ru{};
  if (getrusage(who, &ru) != 0) return -1;
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

// The CPU time of this process's live children (/proc/PID/stat: ppid, utime, stime), in seconds.
double live_children_s(double tick) {
  const pid_t self = getpid();
  double sum = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "stat");
    std::string text;
    if (!std::getline(in, text)) continue;
    const size_t close = text.rfind(')');  // the command name may hold spaces
    if (close == std::string::npos) continue;
    std::istringstream f(text.substr(close + 2));
    std::string field;
    std::vector<std::string> v;  // state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    while (v.size() < 13 && f >> field) v.push_back(field);
    if (v.size() < 13 || std::atol(v[1].c_str()) != long(self)) continue;
    sum += (std::atof(v[11].c_str()) + std::atof(v[12].c_str())) / tick;
  }
  return sum;
}
}  // namespace

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
  c.own_s = rusage_s(RUSAGE_SELF);
  const double ended_children = rusage_s(RUSAGE_CHILDREN);
  if (c.own_s < 0 || ended_children < 0) return c;
  c.family_s = c.own_s + ended_children + live_children_s(tick);
  c.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  c.valid = true;
  return c;
}

CpuShares cpu_shares(const CpuSample& a, const CpuSample& b) {
  CpuShares s;
  const double total = b.total_s - a.total_s;
  if (!a.valid || !b.valid || total <= 0) return s;
  // /proc/stat counts in clock ticks, rusage in microseconds: clamp the difference at 0.
  s.others = std::clamp(((b.busy_s - a.busy_s) - (b.family_s - a.family_s)) / total, 0.0, 1.0);
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

ConditionsProbe::ConditionsProbe(int32_t threads)
    : load_start_(load_average()),
      cores_(int32_t(std::max(1u, std::thread::hardware_concurrency()))),
      cores_used_(std::clamp(threads, 1, cores_)),
      start_(cpu_sample()) {}

MeasureConditions ConditionsProbe::finish() const {
  const CpuSample end = cpu_sample();
  MeasureConditions c;
  c.load_start = load_start_;
  c.load_end = load_average();
  c.cores = cores_;
  c.cores_used = cores_used_;
  c.wall_s = end.wall_s - start_.wall_s;
  const CpuShares s = cpu_shares(start_, end);
  if (s.others < 0) return c;
  c.valid = true;
  c.others = s.others;
  c.steal = s.steal;
  c.taken = cores_taken(s.others, s.steal, cores_, cores_used_);
  return c;
}

double cores_taken(double others, double steal, int32_t cores, int32_t cores_used) {
  // /proc/stat counts every CPU of the machine; the others' core-seconds beyond the cores this
  // command left free came out of its own.
  cores_used = std::clamp(cores_used, 1, std::max(1, cores));
  const double other_cores = (others + steal) * double(cores);
  return std::clamp((other_cores - double(cores - cores_used)) / double(cores_used), 0.0, 1.0);
}

std::string conditions_text(const MeasureConditions& c) {
  const auto load = [](double l) { return l < 0 ? std::string("?") : fmt::format("{:.2f}", l); };
  if (!c.valid)
    return fmt::format("load average {} at the start, {} at the end; other work's share unknown (/proc unreadable)",
                       load(c.load_start), load(c.load_end));
  return fmt::format(
      "load average {} at the start, {} at the end; other work took {:.1f} % of the time of the {} of {} cores it "
      "used (other processes {:.1f} %, steal {:.1f} % of the machine) over {:.1f} s",
      load(c.load_start), load(c.load_end), 100 * c.taken, c.cores_used, c.cores, 100 * c.others, 100 * c.steal,
      c.wall_s);
}

std::string conditions_warning(const MeasureConditions& c, const std::string& what) {
  if (!c.valid || c.taken <= kTakenWarn) return "";
  // Several threads on cores other work wants: OpenMP's default spin-wait makes it far worse (a
  // spinning thread holds the core the one it waits for needs; README, "OpenMP's idle threads").
  const bool spin_hint = c.cores_used > 1 && std::getenv("OMP_WAIT_POLICY") == nullptr;
  return fmt::format(
      "other work took {:.0f} % of the CPU time of the {} core{} {} used (more than {:.0f} %; load average {:.2f} at "
      "the start, {:.2f} at the end): its measured times are those of a busy machine, not this one's own; measure "
      "again when it is quieter{}",
      100 * c.taken, c.cores_used, c.cores_used == 1 ? "" : "s", what, 100 * kTakenWarn, c.load_start, c.load_end,
      spin_hint ? ", or with OMP_WAIT_POLICY=passive (OpenMP's waiting threads then sleep instead of spinning on "
                  "the cores the others need)"
                : "");
}

}  // namespace tandem
