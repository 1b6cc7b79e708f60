#!/usr/bin/env python3
"""The sweep's cluster templates (tools/sweep/) run here, without a cluster.

Usage: sweep_templates_test.py SOURCE_DIR TANDEM

  slurm     tools/sweep/slurm.sbatch's body under bash, once for every SLURM_ARRAY_TASK_ID of its
            #SBATCH --array, on a plan of the N points its 'As written' comment names (the array
            size must be ceil(N / K) for the script's K); collect before the last task must list the points left, after it
            must find every point; a logging shim in front of tandem shows each point asked for
            exactly once
  parallel  tools/sweep/parallel.sh DIR K JOBS: every point once, collect complete (skipped, and
            said so, when GNU parallel is absent: tools/setup --sweep-cluster installs it); and
            with a point that fails (its workload in plan.json broken), a non-zero exit after
            collecting every other point; and `tools/sweep/parallel.sh DIR` as the README writes
            it, with no TANDEM and no tandem on PATH: this checkout's build/tandem
  k8s       tools/sweep/k8s-indexed-job.yaml parsed with python yaml: an Indexed Job whose
            container command, run under sh once for every JOB_COMPLETION_INDEX below
            `completions` with its env (K, SWEEP_DIR = the volume's mountPath), asks for every
            point exactly once; completions = ceil(N / K) for its comment's N; the container
            requests memory and has a memory limit at least as large
  readme    the README's sbatch line passes TANDEM in --export (without it the tasks run
            `tandem` from PATH, exit 127 on nodes that lack it): its task 0, run as that line
            exports it with no tandem on PATH, exits 0

  ray-check tools/sweep-ray's check of a returned slice, without a cluster (its module loaded
            here): a point run by another build fails the slice naming both builds, even with the
            plan's key (as `sweep run` copied it before #34); the plan's own points pass

Exits 1 on a failed check; prints one line per failed check and a count.
"""
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import sweep_helpers as sh  # noqa: E402


def check_coverage(f, what, log, n, d, tandem):
    times = sh.indices_run(sh.runs_logged(log), n)
    f.ok(times == [1] * n, "%s: points asked for %s times (index: times), expected each once"
         % (what, {i: t for i, t in enumerate(times) if t != 1}))
    r = sh.run([tandem, "sweep", "collect", d])
    f.ok(r.returncode == 0, "%s: collect exited %d: %s" % (what, r.returncode, r.stderr.strip()))
    rows = sh.results_rows(d) if os.path.exists(os.path.join(d, "results.csv")) else []
    f.ok(len(rows) - 1 >= n, "%s: results.csv has %d rows for %d points" % (what, len(rows) - 1, n))


def example_points(f, what, text, k, tasks):
    """The N of the template's 'As written: N = 9 points, K = 2, so 5 ...' comment, after checking
    its K and that the tasks (array size, completions) are ceil(N / K)."""
    m = re.search(r"As written: N = (\d+) points, K = (\d+), so (\d+) ", text)
    if not f.ok(m, "%s: no 'As written: N = .. points, K = .., so .. ' comment" % what):
        return tasks * k
    n = int(m.group(1))
    f.ok(int(m.group(2)) == k and int(m.group(3)) == tasks, "%s: the comment says K = %s, %s tasks; the template "
         "has K = %d, %d tasks" % (what, m.group(2), m.group(3), k, tasks))
    f.ok(tasks == -(-n // k), "%s: %d tasks for N = %d, K = %d; ceil(N / K) is %d" % (what, tasks, n, k, -(-n // k)))
    return n


def test_slurm(f, src, tandem, tmp):
    script = os.path.join(src, "tools/sweep/slurm.sbatch")
    text = open(script).read()
    m = re.search(r"^#SBATCH --array=(\d+)-(\d+)\s*$", text, re.M)
    k = re.search(r"^K=\$\{K:-(\d+)\}", text, re.M)
    if not f.ok(m and k, "slurm: no '#SBATCH --array=A-B' line or K=${K:-N} default in %s" % script):
        return
    first, last, k = int(m.group(1)), int(m.group(2)), int(k.group(1))
    f.ok(first == 0, "slurm: the array starts at %d, not 0 (task 0 runs points 0..K-1)" % first)
    tasks = last - first + 1
    n = example_points(f, "slurm", text, k, tasks)
    d, log = os.path.join(tmp, "slurm"), os.path.join(tmp, "slurm.log")
    sh.make_plan(tandem, d, n, src)
    shim = os.path.join(tmp, "shim-slurm")
    sh.make_shim(shim, tandem, log)
    for t in range(first, last + 1):
        if t == last:  # collect must see the last slice missing before it runs
            r = sh.run([tandem, "sweep", "collect", d])
            f.ok(r.returncode == 1, "slurm: collect with the last task not run exited %d, expected 1" % r.returncode)
            missing = [str(i) for i in range(t * k, n)]
            f.ok(all(re.search(r"\b%s\b" % i, r.stderr + r.stdout) for i in missing),
                 "slurm: collect did not list the missing points %s: %s" % (missing, r.stderr.strip()))
        env = dict(os.environ, SLURM_ARRAY_TASK_ID=str(t), SLURM_CPUS_PER_TASK="1", DIR=d, TANDEM=shim)
        env.pop("K", None)
        r = sh.run(["bash", script], env=env)
        f.ok(r.returncode == 0, "slurm: task %d exited %d: %s" % (t, r.returncode, r.stderr.strip()))
    check_coverage(f, "slurm", log, n, d, tandem)
    print("slurm: %d array tasks, K=%d, %d points" % (tasks, k, n))


def test_parallel(f, src, tandem, tmp):
    if not shutil.which("parallel"):
        print("parallel: SKIPPED: GNU parallel is not installed (tools/setup --sweep-cluster installs it)")
        return
    script = os.path.join(src, "tools/sweep/parallel.sh")
    n, k = 7, 2
    d, log = os.path.join(tmp, "par"), os.path.join(tmp, "par.log")
    sh.make_plan(tandem, d, n, src)
    shim = os.path.join(tmp, "shim-par")
    sh.make_shim(shim, tandem, log)
    r = sh.run([script, d, str(k), "2"], env=dict(os.environ, TANDEM=shim))
    f.ok(r.returncode == 0, "parallel: exited %d: %s" % (r.returncode, r.stderr.strip()))
    f.ok(sh.runs_logged(log).count((0, k)) == 1 and "collect" in open(log).read(),
         "parallel: the log shows no slice (0, %d) or no collect: %s" % (k, open(log).read()))
    check_coverage(f, "parallel", log, n, d, tandem)
    # a failing point (3, in the slice of 2 and 3): the rest is collected, the exit is non-zero
    d2 = os.path.join(tmp, "par-fail")
    sh.make_plan(tandem, d2, n, src)
    sh.break_point(d2, 3)
    r = sh.run([script, d2, str(k), "2"], env=dict(os.environ, TANDEM=tandem))
    f.ok(r.returncode != 0, "parallel: a failing point, yet exit 0")
    got = sh.collected_indices(d2)
    f.ok(got == set(range(n)) - {3}, "parallel: a failing point 3: collected points %s, expected all but 3"
         % sorted(got))
    print("parallel: %d points, K=%d, 2 jobs; a failing point: exit %d, the others collected" % (n, k, r.returncode))
    # As the README writes it (#35): no TANDEM, no tandem on PATH: this checkout's build/tandem.
    d3 = os.path.join(tmp, "par-default")
    # Planned by the build the script will run (this checkout's), else its points are refused as
    # another build's (a sanitizer build under test is one).
    default_tandem = os.path.join(src, "build", "tandem")
    sh.make_plan(default_tandem if os.path.exists(default_tandem) else tandem, d3, n, src)
    env = {k2: v for k2, v in os.environ.items() if k2 != "TANDEM"}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not os.path.exists(os.path.join(p, "tandem")))
    r = sh.run([script, d3], env=env)
    if os.path.exists(os.path.join(src, "build", "tandem")):
        f.ok(r.returncode == 0 and sh.collected_indices(d3) == set(range(n)),
             "parallel: as written (no TANDEM), exited %d: %s" % (r.returncode, r.stderr.strip()))
    else:
        f.ok(r.returncode == 2 and "no tandem at" in r.stderr,
             "parallel: as written, no build/tandem: exited %d: %s" % (r.returncode, r.stderr.strip()))


def test_ray_check(f, src, tandem, tmp):
    import importlib.machinery
    import importlib.util
    path = os.path.join(src, "tools", "sweep-ray")
    loader = importlib.machinery.SourceFileLoader("sweep_ray", path)
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader("sweep_ray", loader))
    loader.exec_module(mod)
    plan = {"build": "v1/aaaa", "points": [{"index": 0, "key": "k0"}, {"index": 1, "key": "k1"}]}
    mine = [{"index": 0, "key": "k0", "build": "v1/aaaa"}, {"index": 1, "key": "k1", "build": "v1/aaaa"}]
    f.ok(mod.check_slice(mine, plan, 0, 2) is None, "ray-check: the plan's own points refused")
    other = [dict(mine[0]), dict(mine[1], build="v1/bbbb")]  # the plan's key, another build
    why = mod.check_slice(other, plan, 0, 2) or ""
    f.ok("v1/bbbb" in why and "v1/aaaa" in why, "ray-check: a point of another build passed or is not named with "
         "both builds: %r" % why)
    f.ok("key" in (mod.check_slice([mine[0], dict(mine[1], key="kx")], plan, 0, 2) or ""),
         "ray-check: a point with another key passed")
    print("ray-check: %s" % why)


def quantity(q):
    """A Kubernetes memory quantity in bytes (512Mi, 2Gi, 1G, 1000000); None if not one."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?", str(q).strip())
    if not m:
        return None
    unit = {None: 1, "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "k": 1e3, "M": 1e6, "G": 1e9,
            "T": 1e12}[m.group(2)]
    return float(m.group(1)) * unit


def test_readme_slurm(f, src, tandem, tmp):
    text = open(os.path.join(src, "README.md")).read()
    m = re.search(r"sbatch --array=[^`\n]*? --export=(\S+) tools/sweep/slurm\.sbatch", text)
    if not f.ok(m, "readme: no `sbatch --array=... --export=... tools/sweep/slurm.sbatch` line"):
        return
    exports = dict(kv.split("=", 1) for kv in m.group(1).split(",") if "=" in kv)
    f.ok("TANDEM" in exports, "readme: the sbatch line's --export has no TANDEM (%s): tasks on nodes without tandem "
         "on PATH exit 127" % m.group(1))
    d = os.path.join(tmp, "readme-slurm")
    # As the line exports it: $PWD the checkout; the README's build/tandem, or this test's build if elsewhere.
    env = {"PATH": "/usr/bin:/bin", "SLURM_ARRAY_TASK_ID": "0", "SLURM_CPUS_PER_TASK": "1"}
    for k, v in exports.items():
        if k != "ALL":
            env[k] = v.replace("$PWD", src)
    env["DIR"] = d
    if "TANDEM" in env and not os.path.exists(env["TANDEM"]):
        env["TANDEM"] = tandem
    # Planned by the build the task will run, else its points are refused as another build's.
    sh.make_plan(env.get("TANDEM", tandem), d, 2, src)
    r = sh.run(["bash", os.path.join(src, "tools/sweep/slurm.sbatch")], env=env)
    f.ok(r.returncode == 0, "readme: task 0 with the README's exports and no tandem on PATH exited %d: %s"
         % (r.returncode, r.stderr.strip()))
    print("readme: the sbatch line exports %s; task 0 exit %d" % (",".join(sorted(exports)), r.returncode))


def test_k8s(f, src, tandem, tmp):
    try:
        import yaml
    except ImportError:
        print("k8s: SKIPPED: no python yaml module (Debian's python3-yaml; tools/setup --sweep-cluster)")
        return
    path = os.path.join(src, "tools/sweep/k8s-indexed-job.yaml")
    job = yaml.safe_load(open(path))
    spec = job.get("spec", {})
    f.ok(job.get("kind") == "Job" and job.get("apiVersion") == "batch/v1", "k8s: not a batch/v1 Job")
    f.ok(spec.get("completionMode") == "Indexed", "k8s: completionMode is %r" % spec.get("completionMode"))
    pod = spec.get("template", {}).get("spec", {})
    containers = pod.get("containers") or [{}]
    c = containers[0]
    env = {e["name"]: str(e["value"]) for e in c.get("env", [])}
    cmd = c.get("command", []) + c.get("args", [])
    if not f.ok(len(cmd) == 3 and cmd[:2] in (["/bin/sh", "-c"], ["sh", "-c"]) and "K" in env and "SWEEP_DIR" in env,
                "k8s: expected command [/bin/sh, -c, SCRIPT] and env K, SWEEP_DIR; got %s, %s" % (cmd, env)):
        return
    f.ok("JOB_COMPLETION_INDEX" in cmd[2], "k8s: the command does not use JOB_COMPLETION_INDEX: %s" % cmd[2])
    mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
    vols = {v["name"] for v in pod.get("volumes", [])}
    f.ok(env["SWEEP_DIR"] in mounts.values() and set(mounts) <= vols,
         "k8s: SWEEP_DIR %s is not a mounted volume's path (%s; volumes %s)" % (env["SWEEP_DIR"], mounts, vols))
    f.ok(pod.get("restartPolicy") in ("Never", "OnFailure"), "k8s: restartPolicy %r" % pod.get("restartPolicy"))
    res = c.get("resources") or {}
    req, lim = (quantity((res.get(k) or {}).get("memory", "")) for k in ("requests", "limits"))
    f.ok(req and lim and req <= lim, "k8s: the container needs a memory request and a memory limit at least as "
         "large (a pod without them is the first evicted, or takes the node's memory): %s" % res)
    completions, k = int(spec["completions"]), int(env["K"])
    n = example_points(f, "k8s", open(path).read(), k, completions)
    d, log = os.path.join(tmp, "k8s"), os.path.join(tmp, "k8s.log")
    sh.make_plan(tandem, d, n, src)
    bindir = os.path.join(tmp, "k8s-bin")
    os.makedirs(bindir)
    sh.make_shim(os.path.join(bindir, "tandem"), tandem, log)  # the image's tandem on PATH
    for i in range(completions):
        e = dict(os.environ, JOB_COMPLETION_INDEX=str(i), PATH=bindir + os.pathsep + os.environ["PATH"],
                 K=env["K"], SWEEP_DIR=d)
        r = sh.run(cmd, env=e)
        f.ok(r.returncode == 0, "k8s: index %d exited %d: %s" % (i, r.returncode, r.stderr.strip()))
    check_coverage(f, "k8s", log, n, d, tandem)
    print("k8s: %d completions, K=%d, %d points" % (completions, k, n))


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, tandem = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    if not sh.has_sweep(tandem):
        print("FAIL: %s sweep --help fails: no sweep commands" % tandem)
        return 1
    f = sh.Failures("sweep-templates")
    tmp = tempfile.mkdtemp(prefix="tandem-sweep-tpl-")
    try:
        for t in (test_slurm, test_readme_slurm, test_parallel, test_k8s, test_ray_check):
            t(f, src, tandem, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return f.end()


if __name__ == "__main__":
    sys.exit(main())
