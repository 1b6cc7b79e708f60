#!/usr/bin/env python3
"""tools/sweep/slurm.sbatch under a real one-node Slurm that this test starts and stops.

Usage: sweep_slurm_test.py SOURCE_DIR TANDEM

Opt-in: runs only where Debian's slurm-wlm and munge are installed (apt-get install slurm-wlm
munge; `tools/setup --sweep-cluster` installs them, as CI does) and as root; otherwise exits 77 (skipped) saying why.
Starts, in a temporary folder and in the foreground as its children, munged (its own key and
socket), slurmctld and slurmd (one node, this host at 127.0.0.1, free ports, no accounting),
waits for the node to be idle, then `sbatch --wait` of the template as written (its #SBATCH
--array, K and the N of its 'As written' comment) on a plan of N points with tandem behind a
logging shim. Checks: sbatch exits 0; every array task ran once (its output file); every point
was asked for exactly once; collect finds every point. The daemons are stopped at the end
(SIGTERM, SIGKILL after 10 s), on failure too.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import sweep_helpers as sh  # noqa: E402

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "sinfo")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_conf(tmp, host):
    conf = os.path.join(tmp, "slurm.conf")
    for d in ("state", "spool", "log"):
        os.makedirs(os.path.join(tmp, d), exist_ok=True)
    with open(conf, "w") as f:
        f.write("""ClusterName=tandemtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={p1}
SlurmdPort={p2}
AuthType=auth/munge
AuthInfo=socket={tmp}/munge/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={tmp}/state
SlurmdSpoolDir={tmp}/spool
SlurmctldPidFile={tmp}/slurmctld.pid
SlurmdPidFile={tmp}/slurmd.pid
SlurmctldLogFile={tmp}/log/slurmctld.log
SlurmdLogFile={tmp}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName={host} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
""".format(host=host, tmp=tmp, p1=free_port(), p2=free_port()))
    return conf


def start(tmp, env, host):
    """munged, slurmctld, slurmd in the foreground; returns ([Popen], seconds until the node is idle
    or None)."""
    m = os.path.join(tmp, "munge")
    os.makedirs(m, mode=0o700)
    with open(os.path.join(m, "munge.key"), "wb") as f:
        f.write(os.urandom(1024))
    os.chmod(os.path.join(m, "munge.key"), 0o400)
    t0 = time.time()
    log = open(os.path.join(tmp, "log", "daemons.out"), "w")
    procs = [subprocess.Popen(["munged", "-F", "--force", "--key-file=%s/munge.key" % m, "--socket=%s/munge.sock" % m,
                               "--pid-file=%s/munged.pid" % m, "--log-file=%s/munged.log" % m,
                               "--seed-file=%s/seed" % m], stdout=log, stderr=subprocess.STDOUT)]
    end = time.time() + 15
    while not os.path.exists(os.path.join(m, "munge.sock")) and time.time() < end:
        time.sleep(0.1)
    conf = env["SLURM_CONF"]
    procs.append(subprocess.Popen(["slurmctld", "-D", "-i", "-f", conf], stdout=log, stderr=subprocess.STDOUT, env=env))
    procs.append(subprocess.Popen(["slurmd", "-D", "-f", conf, "-N", host], stdout=log, stderr=subprocess.STDOUT,
                                  env=env))
    end = time.time() + 60
    while time.time() < end and all(p.poll() is None for p in procs):
        r = sh.run(["sinfo", "-h", "-o", "%T"], env=env, timeout=10)
        if r.stdout.strip() == "idle":
            return procs, time.time() - t0
        time.sleep(0.5)
    return procs, None


def stop(procs):
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in reversed(procs):
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, tandem = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    absent = [p for p in DAEMONS + CLIENTS if not shutil.which(p)]
    if absent:
        print("SKIPPED: no %s (opt-in: apt-get install slurm-wlm munge)" % ", ".join(absent))
        return 77
    if os.geteuid() != 0:
        print("SKIPPED: slurmd and slurmctld are started as root here; this is uid %d" % os.geteuid())
        return 77
    if not sh.has_sweep(tandem):
        print("FAIL: %s sweep --help fails: no sweep commands" % tandem)
        return 1
    script = os.path.join(src, "tools/sweep/slurm.sbatch")
    text = open(script).read()
    arr = re.search(r"^#SBATCH --array=(\d+)-(\d+)\s*$", text, re.M)
    kk = re.search(r"^K=\$\{K:-(\d+)\}", text, re.M)
    nn = re.search(r"As written: N = (\d+) points", text)
    f = sh.Failures("sweep-slurm")
    if not f.ok(arr and kk and nn, "no #SBATCH --array, K default or 'As written: N =' in %s" % script):
        return f.end()
    first, last, k, n = int(arr.group(1)), int(arr.group(2)), int(kk.group(1)), int(nn.group(1))
    tmp = tempfile.mkdtemp(prefix="tandem-slurm-")
    os.chmod(tmp, 0o755)  # munged wants the socket's folders searchable
    host = socket.gethostname().split(".")[0]
    env = dict(os.environ, SLURM_CONF=write_conf(tmp, host))
    procs = []
    try:
        procs, up = start(tmp, env, host)
        if not f.ok(up is not None, "the Slurm node was not idle within 60 s; logs in %s/log:\n%s" % (
                tmp, sh.run(["tail", "-n", "20", os.path.join(tmp, "log", "slurmctld.log"),
                             os.path.join(tmp, "log", "slurmd.log"), os.path.join(tmp, "log", "daemons.out")]).stdout)):
            return f.end()
        print("slurm: munged + slurmctld + slurmd up, node idle in %.1f s" % up)
        d, log = os.path.join(tmp, "plan"), os.path.join(tmp, "shim.log")
        sh.make_plan(tandem, d, n, src)
        shim = os.path.join(tmp, "shim")
        sh.make_shim(shim, tandem, log)
        t0 = time.time()
        r = sh.run(["sbatch", "--wait", "--export=ALL,DIR=%s,TANDEM=%s" % (d, shim),
                    "--output=%s/log/task-%%a.out" % tmp, script], env=env, timeout=120)
        f.ok(r.returncode == 0, "sbatch --wait exited %d: %s %s" % (r.returncode, r.stdout, r.stderr))
        print("slurm: array %d-%d (K=%d, %d points) ran in %.1f s" % (first, last, k, n, time.time() - t0))
        outs = sorted(x for x in os.listdir(os.path.join(tmp, "log")) if x.startswith("task-"))
        f.ok(outs == sorted("task-%d.out" % t for t in range(first, last + 1)), "array tasks' outputs: %s" % outs)
        times = sh.indices_run(sh.runs_logged(log), n)
        f.ok(times == [1] * n, "points asked for %s times, expected each once"
             % {i: t for i, t in enumerate(times) if t != 1})
        r = sh.run([tandem, "sweep", "collect", d])
        f.ok(r.returncode == 0, "collect exited %d: %s" % (r.returncode, r.stderr.strip()))
        f.ok(len(sh.results_rows(d)) - 1 >= n, "results.csv has %d rows for %d points"
             % (len(sh.results_rows(d)) - 1, n))
    finally:
        t0 = time.time()
        stop(procs)
        print("slurm: daemons stopped in %.1f s" % (time.time() - t0))
        shutil.rmtree(tmp, ignore_errors=True)
    return f.end()


if __name__ == "__main__":
    sys.exit(main())
