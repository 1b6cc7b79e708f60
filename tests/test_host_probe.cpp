// sim/host_probe: the conditions a measuring command records (issue #35, 2).
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

#include "sim/base/host_probe.h"

using namespace tandem;

namespace {
// Spins for `s` seconds of CPU time (the child's work, not this process's).
void spin_cpu(double s) {
  const clock_t end = clock() + clock_t(s * CLOCKS_PER_SEC);
  volatile unsigned x = 0;
  while (clock() < end) x = x + 1;
}
}  // namespace

TEST_CASE("host probe: a child's CPU time is the family's, not other work's") {
  const CpuSample before = cpu_sample();
  REQUIRE(before.valid);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    spin_cpu(0.4);
    _exit(0);
  }
  // While the child lives (/proc/PID/stat), and after it ended (RUSAGE_CHILDREN).
  const auto t0 = std::chrono::steady_clock::now();
  CpuSample alive;
  do {
    usleep(50'000);
    alive = cpu_sample();
  } while (alive.family_s - alive.own_s - (before.family_s - before.own_s) < 0.2 &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
  CHECK(alive.family_s - alive.own_s - (before.family_s - before.own_s) >= 0.2);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  const CpuSample after = cpu_sample();
  CHECK(after.family_s - after.own_s - (before.family_s - before.own_s) >= 0.35);
  // The child's time is not counted as other processes': at most the rest of the machine's.
  const CpuShares s = cpu_shares(before, after);
  CHECK(s.others >= 0);
  CHECK(s.others <= 1);
}

TEST_CASE("host probe: the share of its cores other work took, beyond the cores it left free") {
  CHECK(cores_taken(0.5, 0, 2, 1) == doctest::Approx(0.0));   // one busy core beside a 1-core run: its own is free
  CHECK(cores_taken(0.75, 0, 2, 1) == doctest::Approx(0.5));  // 1.5 busy cores: half of its one
  CHECK(cores_taken(0.75, 0, 2, 2) == doctest::Approx(0.75));
  CHECK(cores_taken(0.5, 0.25, 2, 2) == doctest::Approx(0.75));  // steal takes cores too
  CHECK(cores_taken(1.0, 0, 4, 8) == doctest::Approx(1.0));      // more threads than cores: all of them
  CHECK(cores_taken(0.1, 0, 8, 2) == doctest::Approx(0.0));
}

TEST_CASE("host probe: the warning names the share, the cores and the threshold, only above it") {
  MeasureConditions c;
  c.valid = true;
  c.cores = 2;
  c.cores_used = 1;
  c.load_start = 3.5;
  c.load_end = 4.25;
  c.others = 0.9;
  c.steal = 0;
  c.taken = kTakenWarn + 0.05;
  const std::string w = conditions_warning(c, "this run");
  CHECK(w.find("other work took 30 % of the CPU time of the 1 core this run used (more than 25 %") == 0);
  CHECK(w.find("load average 3.50 at the start, 4.25 at the end") != std::string::npos);
  CHECK(w.find("OMP_WAIT_POLICY") == std::string::npos);  // one thread: nothing spins at a barrier
  // Several threads: the hint names OMP_WAIT_POLICY exactly when it is not set already.
  c.cores_used = 2;
  const char* set = std::getenv("OMP_WAIT_POLICY");
  const std::string kept = set ? set : "";
  unsetenv("OMP_WAIT_POLICY");
  CHECK(conditions_warning(c, "this run").find("or with OMP_WAIT_POLICY=passive") != std::string::npos);
  setenv("OMP_WAIT_POLICY", "passive", 1);
  CHECK(conditions_warning(c, "this run").find("OMP_WAIT_POLICY") == std::string::npos);
  if (set)
    setenv("OMP_WAIT_POLICY", kept.c_str(), 1);
  else
    unsetenv("OMP_WAIT_POLICY");
  c.cores_used = 1;
  c.taken = kTakenWarn;
  CHECK(conditions_warning(c, "this run").empty());
  c.taken = 0.9;
  c.valid = false;  // /proc unreadable: nothing to warn about, and the text says so
  CHECK(conditions_warning(c, "this run").empty());
  CHECK(conditions_text(c).find("unknown") != std::string::npos);
}

TEST_CASE("host probe: a probe of this process alone sees its cores") {
  const ConditionsProbe probe(1);
  spin_cpu(0.05);
  const MeasureConditions c = probe.finish();
  CHECK(c.valid);
  CHECK(c.cores_used == 1);
  CHECK(c.cores >= 1);
  CHECK(c.taken >= 0);
  CHECK(c.taken <= 1);
  CHECK(c.wall_s > 0);
  CHECK(conditions_text(c).find("of the 1 of") != std::string::npos);
}
