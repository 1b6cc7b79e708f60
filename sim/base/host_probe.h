// What a measuring command records about where and under what contention it measured:
// calibrate's profiles, and every measured run (summary.json's `conditions`).
#pragma once
#include <cstdint>
#include <string>

namespace tandem {

std::string git_version();  // the build's code version, not the current directory's
std::string cpu_name();     // /proc/cpuinfo's model name
std::string gpu_name();     // nvidia-smi's name and driver of GPU 0, or "unknown GPU"
std::string utc_now();      // ISO 8601, seconds

// Contention from other work, for the record of the conditions a command measured under.
// A sample of the machine's CPU time (/proc/stat, all CPUs), this process's own (getrusage) and
// its family's: its own plus its children's, live (/proc/PID/stat: a 1P1D run's decode worker) or
// ended; two samples give the share of the machine that other processes used, and the share
// stolen by a hypervisor, in between. Unreadable /proc: valid is false and the shares are -1.
struct CpuSample {
  bool valid = false;
  double busy_s = 0, total_s = 0, steal_s = 0, own_s = 0, family_s = 0, wall_s = 0;
};
CpuSample cpu_sample();
struct CpuShares {
  double others = -1, steal = -1;  // fractions of all the machine's CPU time over the interval
  double own_cores = -1;           // this process's CPU time over the wall time: cores it had on average
};
CpuShares cpu_shares(const CpuSample& from, const CpuSample& to);
double load_average();  // the 1-minute load average, -1 when unknown

// The conditions a measuring command ran under (a run on a real backend, calibrate in each mode,
// bench_cpu): the load average at its start and end, and over the interval the share of the CPU
// time of the cores it used that other work took. The cores it used: those its threads could
// occupy at once, at most the machine's. Other work counts against it beyond the cores it left
// free: taken = max(0, (others + steal) x cores - (cores - cores used)) / cores used.
struct MeasureConditions {
  bool valid = false;  // /proc was readable
  double load_start = -1, load_end = -1;
  int32_t cores = 0, cores_used = 0;
  double others = -1, steal = -1;  // shares of the machine's CPU time (cpu_shares)
  double taken = -1;               // share of its cores' time other work (processes, steal) took
  double wall_s = 0;
};
// Measuring commands warn (stderr, summary.json's `warnings`, the tools) when other work took more
// than this share of their cores' time: a quarter of their time gone puts their figures off by a
// third or more (what it saw: reports/simulation-fidelity/report.md, "Measured under contention").
constexpr double kTakenWarn = 0.25;

// The share of its cores' time that other work took, from the shares of the machine's CPU time
// other processes used and a hypervisor stole, on `cores` cores of which it used `cores_used`.
double cores_taken(double others, double steal, int32_t cores, int32_t cores_used);

class ConditionsProbe {
 public:
  explicit ConditionsProbe(int32_t threads);  // starts: the load average and a CPU sample
  MeasureConditions finish() const;           // what happened since
 private:
  double load_start_;
  int32_t cores_, cores_used_;
  CpuSample start_;
};
// One line: "load average 0.52 at the start, 0.61 at the end; other work took 3.1 % of its 2
// cores' time (other processes 3.1 %, steal 0.0 %) over 12.3 s".
std::string conditions_text(const MeasureConditions& c);
// The warning when other work took more than kTakenWarn of its cores' time, naming what measured
// ("this run", "the calibration"); "" otherwise (and when /proc was unreadable).
std::string conditions_warning(const MeasureConditions& c, const std::string& what);

}  // namespace tandem
