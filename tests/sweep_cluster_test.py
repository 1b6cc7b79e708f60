#!/usr/bin/env python3
"""tools/sweep-ray on a real Ray cluster that this test starts on this machine and stops.

Usage: sweep_cluster_test.py SOURCE_DIR TANDEM

Starts `ray start --head --port=P --num-cpus 2 --node-ip-address=127.0.0.1 --block` (loopback only) from SOURCE_DIR/.venv-sweep in a session
of its own (temporary --temp-dir), then:
  run       a 7-point plan, --slice 2 (4 tasks, the last of one point), tandem behind a logging
            shim: exit 0; results/slice-{0,2,4,6}.json each exactly its points; the shim saw each
            slice once, with --stdout; collect complete; results.csv the same rows as a local
            `tandem sweep run` of the same plan and collect; progress on stderr without a
            terminal: a line a slice, ending "7/7 points"
  tty       the same under a pseudo-terminal: one line rewritten in place (\\r), ending "7/7
            points"; the earlier run's slice files removed first
  failure   point 3's workload in plan.json broken: its slice (2-3) is tried twice (Ray's one
            retry) and named on stderr; exit 1; every other point collected, point 2 from what
            the failed slice's last try printed; collect lists point 3
  capacity  workloads/sweeps/stage4_capacity.yaml (4 points, each a capacity search), --slice 3:
            capacity.csv and results.csv byte-identical to a local run's
  mutation  a copy of tools/sweep-ray whose slicing drops the last slice must fail the run checks
  build     --tandem a copy of tandem with one byte appended (another build): exit 1, every slice
            named, stderr naming both builds; collect finds no point (#34)
The cluster is stopped at the end, on failure too: SIGTERM to `ray start`, then SIGKILL to its
process group after 15 s. Exit 77 (skipped) when .venv-sweep or its ray is missing (tools/setup --sweep-cluster).
"""
import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import sweep_helpers as sh  # noqa: E402

N, K = 7, 2
RUN_TIMEOUT = 90


class Cluster:
    """A one-node Ray cluster in a process group of its own, started with `ray start --block`."""

    def __init__(self, venv, tmp):
        self.log = os.path.join(tmp, "ray-start.log")
        # Loopback only: every address of the cluster, the driver's and the workers' is 127.0.0.1.
        # Ray's own switch for a one-machine cluster (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, set in
        # this process's environment, which ray start, sweep-ray and the workers inherit) makes
        # it use the loopback address; otherwise it takes the machine's interface address,
        # whatever --node-ip-address says. It then prints no join command, so the GCS port is
        # chosen here.
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        cmd = [os.path.join(venv, "bin", "ray"), "start", "--head", "--port=%d" % port, "--num-cpus=2",
               "--node-ip-address=127.0.0.1",
               "--temp-dir", os.path.join(tmp, "ray"), "--object-store-memory", str(100 * 1000 * 1000),
               "--include-dashboard=false", "--disable-usage-stats", "--block"]
        t0 = time.time()
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                         env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"))
        self.address = None
        while time.time() - t0 < 60 and self.proc.poll() is None:
            if "Ray runtime started" in open(self.log).read():
                self.address = "127.0.0.1:%d" % port
                break
            time.sleep(0.2)
        self.start_s = time.time() - t0

    def stop(self):
        """SIGTERM to `ray start --block` (it drains and stops what it started), then SIGKILL to
        whatever is left in its process group after 15 s; returns the seconds taken."""
        t0 = time.time()
        for sig, wait, target in ((signal.SIGTERM, 15, self.proc.pid), (signal.SIGKILL, 5, -self.proc.pid)):
            try:
                os.kill(target, sig)
            except ProcessLookupError:
                pass
            end = time.time() + wait
            while time.time() < end and group_alive(self.proc.pid):
                self.proc.poll()
                time.sleep(0.2)
            if not group_alive(self.proc.pid):
                break
        self.proc.poll()
        return time.time() - t0


def group_alive(pgid):
    """Whether a process other than a zombie is left in process group pgid."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def sweep_ray(args, tool=None, python=None, tty=False):
    """Runs tools/sweep-ray (or the copy `tool`) -> (exit, stdout, stderr)."""
    cmd = ([python] if python else []) + [tool or os.path.join(SRC, "tools", "sweep-ray")] + args
    if not tty:
        r = sh.run(cmd, timeout=RUN_TIMEOUT)
        return r.returncode, r.stdout, r.stderr
    master, slave = pty.openpty()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    err, end = b"", time.time() + RUN_TIMEOUT
    while time.time() < end:
        if select.select([master], [], [], 0.5)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal's last writer is gone
                break
            if not chunk:
                break
            err += chunk
        elif p.poll() is not None:
            break
    os.close(master)
    try:
        out, _ = p.communicate(timeout=max(1, end - time.time()))
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
    return p.returncode, out, err.decode(errors="replace")


def run_problems(d, log, rc, err, local_rows):
    """What is wrong with a sweep-ray run of the N-point plan in d at slice K (empty: nothing)."""
    p = []
    if rc != 0:
        p.append("exit %s" % rc)
    want = [(i, min(K, N - i)) for i in range(0, N, K)]
    for i, k in want:
        path = os.path.join(d, "results", "slice-%d.json" % i)
        try:
            got = [x["index"] for x in json.load(open(path))]
        except (OSError, ValueError, KeyError, TypeError) as e:
            p.append("slice-%d.json: %s" % (i, e))
            continue
        if got != list(range(i, i + k)):
            p.append("slice-%d.json holds points %s" % (i, got))
    calls = sh.runs_logged(log)
    if sorted(calls) != want:
        p.append("tandem sweep run calls %s, expected %s" % (sorted(calls), want))
    if not all("--stdout" in line for line in (open(log) if os.path.exists(log) else []) if line.startswith("sweep run")):
        p.append("a sweep run call without --stdout")
    rows = sh.results_rows(d) if os.path.exists(os.path.join(d, "results.csv")) else []
    if rows != local_rows:
        p.append("results.csv differs from the local run's: %d rows vs %d" % (len(rows), len(local_rows)))
    if not re.search(r"(?<!\d)%d/%d points\b" % (N, N), err):
        p.append("no '%d/%d points' progress" % (N, N))
    return p


def local_rows(tandem, plan_dir, tmp):
    """results.csv rows of `tandem sweep run` of every point of the plan, run here, and collect."""
    d = os.path.join(tmp, "local")
    os.makedirs(d)
    shutil.copy(os.path.join(plan_dir, "plan.json"), d)
    r = sh.run([tandem, "sweep", "run", d, "--index", "0", "--count", str(N)])
    if r.returncode != 0:
        raise RuntimeError("local sweep run: %s" % r.stderr)
    r = sh.run([tandem, "sweep", "collect", d])
    if r.returncode != 0:
        raise RuntimeError("local sweep collect: %s" % r.stderr)
    return sh.results_rows(d)


def tests(f, venv, tandem, cluster, tmp):
    addr = ["--address", cluster.address, "--local-tandem", tandem]
    d, log = os.path.join(tmp, "plan"), os.path.join(tmp, "shim.log")
    sh.make_plan(tandem, d, N, SRC)
    shim = os.path.join(tmp, "shim")
    sh.make_shim(shim, tandem, log)
    rows = local_rows(tandem, d, tmp)
    f.ok(len(rows) == N + 1, "local run: %d rows for %d points" % (len(rows) - 1, N))

    # run: through the shebang's python3 (re-runs itself under .venv-sweep when it lacks ray)
    t0 = time.time()
    rc, out, err = sweep_ray([d, "--slice", str(K), "--tandem", shim] + addr)
    ray_s = time.time() - t0
    problems = run_problems(d, log, rc, err, rows)
    f.ok(not problems, "run: %s\nstderr:\n%s" % ("; ".join(problems), err))
    lines = [l for l in err.splitlines() if re.match(r"\d+/%d points" % N, l)]
    f.ok(len(lines) == len(range(0, N, K)), "run: %d progress lines without a terminal, expected one a slice: %s"
         % (len(lines), lines))
    print("run: %d points, %d slices in %.1f s (sweep-ray, connect included)" % (N, len(range(0, N, K)), ray_s))

    # tty: the same plan folder again, progress on a pseudo-terminal
    os.remove(log)
    rc, out, err = sweep_ray([d, "--slice", str(K), "--tandem", shim] + addr, tty=True)
    problems = run_problems(d, log, rc, err, rows)
    f.ok(not problems, "tty: %s\nstderr:\n%s" % ("; ".join(problems), err))
    f.ok("\r" in err and not re.search(r"\d+/%d points[^\r\n]*\n[^\r]*\d+/%d points" % (N, N), err),
         "tty: progress is not one line rewritten with \\r: %r" % err)
    f.ok("removed %d slice files" % len(range(0, N, K)) in err, "tty: no note of the earlier slice files removed")

    # failure: point 3 fails on every try
    d2, log2 = os.path.join(tmp, "fail"), os.path.join(tmp, "fail.log")
    sh.make_plan(tandem, d2, N, SRC)
    sh.break_point(d2, 3)
    shim2 = os.path.join(tmp, "shim2")
    sh.make_shim(shim2, tandem, log2)
    rc, out, err = sweep_ray([d2, "--slice", str(K), "--tandem", shim2] + addr)
    f.ok(rc == 1, "failure: exit %d, expected 1" % rc)
    calls = sh.runs_logged(log2)
    f.ok(calls.count((2, K)) == 2, "failure: the failing slice ran %d times, expected 2 (one retry): %s"
         % (calls.count((2, K)), calls))
    f.ok(all(calls.count(c) == 1 for c in [(0, 2), (4, 2), (6, 1)]), "failure: other slices not once each: %s" % calls)
    f.ok(re.search(r"failed after a retry: slice 2 \(points 2-3\)", err), "failure: slice 2 not named:\n%s" % err)
    got = sh.collected_indices(d2)
    f.ok(got == set(range(N)) - {3}, "failure: collected points %s, expected all but 3 (point 2 from the failed "
         "slice's last try)" % sorted(got))
    f.ok(re.search(r"point\(s\) never ran \(no result in [^)]*\): 3\b", err),
         "failure: collect did not list point 3 as never run:\n%s" % err)

    # capacity: a capacity search's sweep, its tables as a local run's
    d3, ld3 = os.path.join(tmp, "cap"), os.path.join(tmp, "cap-local")
    sweep = os.path.join(SRC, "workloads", "sweeps", "stage4_capacity.yaml")
    r = sh.run([tandem, "sweep", "plan", sweep, "--out", d3])
    if f.ok(r.returncode == 0, "capacity: plan: %s" % r.stderr):
        shutil.copytree(d3, ld3)
        n3 = json.load(open(os.path.join(d3, "plan.json")))["count"]
        r = sh.run([tandem, "sweep", "run", ld3, "--index", "0", "--count", str(n3)])
        r2 = sh.run([tandem, "sweep", "collect", ld3])
        f.ok(r.returncode == 0 and r2.returncode == 0, "capacity: local run/collect: %s %s" % (r.stderr, r2.stderr))
        rc, out, err = sweep_ray([d3, "--slice", "3", "--tandem", tandem] + addr)
        f.ok(rc == 0, "capacity: sweep-ray exit %d:\n%s" % (rc, err))
        for name in ("capacity.csv", "results.csv"):
            a, b = (os.path.join(x, name) for x in (d3, ld3))
            f.ok(os.path.exists(a) and open(a).read() == open(b).read(), "capacity: %s differs from the local run's" % name)
        f.ok("capacity" in out, "capacity: collect's table not printed: %s" % out)
        print("capacity: %d points (%s) through Ray: capacity.csv and results.csv as the local run's"
              % (n3, os.path.basename(sweep)))

    # build: a binary that differs by one byte is another build; its slices are refused
    other = os.path.join(tmp, "tandem-other")
    shutil.copy(tandem, other)
    with open(other, "ab") as fh:
        fh.write(b"x")
    d4 = os.path.join(tmp, "build")
    sh.make_plan(tandem, d4, 3, SRC)
    plan_build = json.load(open(os.path.join(d4, "plan.json")))["build"]
    rc, out, err = sweep_ray([d4, "--slice", "2", "--tandem", other] + addr)
    f.ok(rc == 1, "build: another build's tandem, exit %d (expected 1):\n%s" % (rc, err))
    f.ok(plan_build in err and re.search(r"this tandem is build \S+", err), "build: both builds not named:\n%s" % err)
    f.ok(sh.collected_indices(d4) == set(), "build: points of another build collected: %s" % sh.collected_indices(d4))
    print("build: --tandem of another build refused: %s" % re.findall(r"this tandem is build \S+", err)[:1])

    # mutation: a slicing that drops the last slice is caught by the run checks
    mut = os.path.join(tmp, "mut", "tools")
    os.makedirs(mut)
    for name in ("sweep-ray", "tandem_tools.py"):
        shutil.copy(os.path.join(SRC, "tools", name), mut)
    text = open(os.path.join(mut, "sweep-ray")).read()
    bad = text.replace("for i in range(0, n, k)]", "for i in range(0, n - 1, k)]")
    if f.ok(bad != text, "mutation: the slicing line of tools/sweep-ray was not found"):
        open(os.path.join(mut, "sweep-ray"), "w").write(bad)
        os.remove(log)
        rc, out, err = sweep_ray([d, "--slice", str(K), "--tandem", shim] + addr,
                                 tool=os.path.join(mut, "sweep-ray"), python=os.path.join(venv, "bin", "python"))
        problems = run_problems(d, log, rc, err, rows)
        f.ok(problems, "mutation: a run that drops slice 6 passed the run checks")
        print("mutation: dropping the last slice is caught: %s" % "; ".join(problems))


def main():
    global SRC
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    SRC, tandem = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    venv = os.path.join(SRC, ".venv-sweep")
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        print("SKIPPED: no %s (tools/setup --sweep-cluster makes it)" % venv)
        return 77
    r = sh.run([py, "-c", "import ray; print(ray.__version__)"])
    if r.returncode != 0:
        print("SKIPPED: %s cannot import ray: %s" % (py, r.stderr.strip()[-300:]))
        return 77
    if not sh.has_sweep(tandem):
        print("FAIL: %s sweep --help fails: no sweep commands" % tandem)
        return 1
    f = sh.Failures("sweep-ray")
    tmp = tempfile.mkdtemp(prefix="tsr-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    cluster = None
    try:
        cluster = Cluster(venv, tmp)
        if f.ok(cluster.address, "ray start gave no address in %.0f s:\n%s" % (cluster.start_s, open(cluster.log).read())):
            print("ray %s: cluster at %s started in %.1f s" % (r.stdout.strip(), cluster.address, cluster.start_s))
            tests(f, venv, tandem, cluster, tmp)
    finally:
        if cluster:
            s = cluster.stop()
            f.ok(not group_alive(cluster.proc.pid), "the cluster's processes outlived SIGKILL")
            print("cluster stopped in %.1f s" % s)
        shutil.rmtree(tmp, ignore_errors=True)
    return f.end()


if __name__ == "__main__":
    sys.exit(main())
