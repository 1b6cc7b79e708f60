"""Shared by the tests of the sweep's cluster adapters (tests/sweep_cluster_test.py,
tests/sweep_templates_test.py, tests/sweep_slurm_test.py): a plan of N points, a point made to
fail, a logging shim in front of tandem that records every `sweep run` it is asked for, and the
checks on what ran.
Standard library only.
"""
import csv
import json
import os
import shlex
import stat
import subprocess



class Failures:
    """Counts checks; prints a line per failed one."""

    def __init__(self, name):
        self.name, self.passed, self.failed = name, 0, 0

    def ok(self, cond, msg):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print("FAIL: %s" % msg, flush=True)
        return cond

    def end(self):
        print("%s: %d passed, %d failed" % (self.name, self.passed, self.failed), flush=True)
        return 1 if self.failed else 0


def run(cmd, **kw):
    """subprocess.run with text output captured (timeout 120 s unless given)."""
    kw.setdefault("timeout", 120)
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def has_sweep(tandem):
    """Whether `tandem sweep --help` works (the sweep commands are built)."""
    try:
        r = run([tandem, "sweep", "--help"], timeout=30)
    except OSError:
        return False
    return r.returncode == 0 and "collect" in r.stdout + r.stderr


def make_plan(tandem, out, n, src):
    """`tandem sweep plan` into out of an n-point sweep: the quickstart workload cut to 20 requests,
    a grid of n values of engine.max_num_seqs (1..n), one rate; returns the plan (plan.json)."""
    os.makedirs(out, exist_ok=True)
    sweep = out + ".sweep.yaml"
    with open(sweep, "w") as f:
        f.write("workload: %s\nset: {requests.count: 20}\ngrid:\n  engine.max_num_seqs: [%s]\nrates: [10]\n"
                % (os.path.join(src, "workloads", "quickstart.yaml"), ", ".join(str(1 + i) for i in range(n))))
    r = run([tandem, "sweep", "plan", sweep, "--out", out])
    if r.returncode != 0:
        raise RuntimeError("tandem sweep plan failed (%d): %s" % (r.returncode, r.stderr))
    with open(os.path.join(out, "plan.json")) as f:
        plan = json.load(f)
    if plan["count"] != n or r.stdout.split()[:1] != [str(n)]:
        raise RuntimeError("tandem sweep plan: %s points, printed %r; expected %d" % (plan["count"], r.stdout, n))
    return plan


def break_point(out, index):
    """Makes point `index` of the plan in out fail when run: its workload in plan.json unparseable."""
    path = os.path.join(out, "plan.json")
    with open(path) as f:
        plan = json.load(f)
    plan["points"][index]["workload"] = "requests: [this is: not a workload\n"
    with open(path, "w") as f:
        json.dump(plan, f)


def collected_indices(d):
    """The point indices with a row in DIR/results.csv (its first column, 'index')."""
    rows = results_rows(d) if os.path.exists(os.path.join(d, "results.csv")) else [["index"]]
    return {int(r[0]) for r in rows[1:]}


def make_shim(path, tandem, log):
    """An executable at path that appends its arguments (one line) to log, then runs tandem."""
    with open(path, "w") as f:
        f.write("#!/bin/sh\nprintf '%%s\\n' \"$*\" >> %s\nexec %s \"$@\"\n" % (shlex.quote(log), shlex.quote(tandem)))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def runs_logged(log):
    """The `sweep run` calls a shim logged: [(index, count)]."""
    calls = []
    if not os.path.exists(log):
        return calls
    with open(log) as f:
        for line in f:
            w = line.split()
            if w[:2] == ["sweep", "run"]:
                count = int(w[w.index("--count") + 1]) if "--count" in w else 1
                calls.append((int(w[w.index("--index") + 1]), count))
    return calls


def indices_run(calls, n):
    """How many times each point 0..n-1 was asked for by the calls (index, count)."""
    times = [0] * n
    for i, k in calls:
        for j in range(i, min(i + k, n)):
            times[j] += 1
    return times


def results_rows(d):
    """DIR/results.csv as a list of rows (lists of strings), header first."""
    with open(os.path.join(d, "results.csv"), newline="") as f:
        return list(csv.reader(f))
