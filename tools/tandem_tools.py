#!/usr/bin/env python3
"""Shared code of the tools in tools/: `tandem run` into an output folder, reading its outputs,
percentiles, text tables, the simulated-vs-measured error table, the capacity sweep, and a
time-kept run of steps (a prepared call on a lent device: TimeKeeper).

Standard library only; matplotlib only through pyplot(), imported when a plot is drawn.
A tool in tools/ imports it with
    sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
    import tandem_tools as tt
The bash tools use its command line:
    python3 tools/tandem_tools.py compare [--title TEXT] [--metrics K1,K2,...] [--ratio A/B]
                                          LABEL=MEASURED_DIR,SIMULATED_DIR ...
prints the error table of each simulated run folder against its measured one (summary.json),
and with --ratio A/B the ratio of config A to config B, measured and simulated. Metric keys:
METRICS below (e.g. ttft_mean, tpot_p99, req_per_s, hit_rate).
    python3 tools/tandem_tools.py conditions RUN_DIR ...
prints each measured run's conditions (summary.json's `conditions`: load, the share of its cores'
time other work took) and its warnings.
"""
import argparse
import csv
import json
import math
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time

NAN = float("nan")
# A measured run warns when other work took more than this share of its cores' time (sim/base/host_probe.h
# kTakenWarn; summary.json records it as conditions.cores_taken_warn_above).
TAKEN_WARN = 0.25

# Metric key -> (label, unit, path in summary.json (None: a tool computes it), value when absent).
# The keys are those of the bench tools' --json files.
METRICS = {
    "ttft_mean": ("TTFT mean", "ms", ("ttft_ms", "mean"), NAN),
    "ttft_p50": ("TTFT p50", "ms", ("ttft_ms", "p50"), NAN),
    "ttft_p90": ("TTFT p90", "ms", ("ttft_ms", "p90"), NAN),
    "ttft_p99": ("TTFT p99", "ms", ("ttft_ms", "p99"), NAN),
    "tpot_mean": ("TPOT mean", "ms", ("tpot_ms", "mean"), NAN),
    "tpot_p50": ("TPOT p50", "ms", ("tpot_ms", "p50"), NAN),
    "tpot_p90": ("TPOT p90", "ms", ("tpot_ms", "p90"), NAN),
    "tpot_p99": ("TPOT p99", "ms", ("tpot_ms", "p99"), NAN),
    "itl_p50": ("ITL p50", "ms", ("itl_ms", "p50"), NAN),
    "itl_p90": ("ITL p90", "ms", ("itl_ms", "p90"), NAN),
    "itl_p99": ("ITL p99", "ms", ("itl_ms", "p99"), NAN),
    "itl_max": ("ITL max", "ms", ("itl_ms", "max"), NAN),
    "itl_std": ("ITL std", "ms", ("itl_ms", "std"), NAN),
    "e2e_mean": ("E2E mean", "ms", ("e2e_ms", "mean"), NAN),
    "e2e_p50": ("E2E p50", "ms", ("e2e_ms", "p50"), NAN),
    "e2e_p99": ("E2E p99", "ms", ("e2e_ms", "p99"), NAN),
    "queue_mean": ("queue mean", "ms", ("queue_ms", "mean"), NAN),
    "req_per_s": ("throughput", "req/s", ("throughput", "requests_per_s"), NAN),
    "out_tok_per_s": ("output throughput", "tok/s", ("throughput", "output_tokens_per_s"), NAN),
    "goodput_req_per_s": ("goodput", "req/s", ("goodput", "requests_per_s"), NAN),
    "makespan_s": ("makespan", "s", ("makespan_s",), NAN),
    "wall_s": ("wall time", "s", ("wall_s",), NAN),
    "steps": ("steps", "", ("steps",), NAN),
    "decode_steps_with_prefill_share": ("decode steps with prefill", "share",
                                        ("steps_mix", "decode_steps_with_prefill_share"), NAN),
    "kv_mean_util": ("KV mean use", "share", ("kv_cache", "mean_util"), NAN),
    "hit_rate": ("token hit rate", "share", ("prefix_cache", "hit_rate"), NAN),
    "block_hit_rate": ("block hit rate", "share", ("prefix_cache", "block_hit_rate"), 0.0),
    "evictions": ("evictions", "blocks", ("prefix_cache", "evictions"), 0),
    "finished": ("finished", "requests", ("requests", "finished"), NAN),
    "failed": ("failed", "requests", ("requests", "failed"), NAN),
    # prefill/decode disaggregation (absent from a colocated run's summary)
    "transfer_p50": ("KV transfer p50", "ms", ("disaggregation", "transfer_ms", "p50"), NAN),
    "transfer_p99": ("KV transfer p99", "ms", ("disaggregation", "transfer_ms", "p99"), NAN),
    "transfer_max": ("KV transfer max", "ms", ("disaggregation", "transfer_ms", "max"), NAN),
    "transfers_delivered": ("transfers delivered", "", ("disaggregation", "transfers", "delivered"), NAN),
    "transfers_failed": ("transfers failed", "", ("disaggregation", "transfers", "failed"), NAN),
    # computed from requests.csv by tools/bench-prefix
    "ttft_hit_mean": ("TTFT mean, requests that hit", "ms", None, NAN),
    "ttft_miss_mean": ("TTFT mean, requests that missed", "ms", None, NAN),
    "n_hit": ("requests that hit", "requests", None, NAN),
    "prefill_tokens_computed": ("prefill tokens computed", "tokens", None, NAN),
}
for _part in ("long", "short"):  # computed from requests.csv by tools/bench-chunked (--long-from)
    METRICS.update({"ttft_%s_%s" % (_part, q): ("TTFT %s prompts %s" % (_part, q), "ms", None, NAN)
                    for q in ("mean", "p50", "p99")})
    METRICS["n_%s" % _part] = ("%s prompts" % _part, "requests", None, NAN)


def metric(summary, key):
    """The value of metric `key` in a summary.json object (METRICS gives the path)."""
    _, _, path, absent = METRICS[key]
    v = summary
    for p in path or [None]:  # a metric that no summary holds (path None) is absent
        if not isinstance(v, dict) or p not in v:
            return absent
        v = v[p]
    return v


def summary_metrics(summary, keys):
    return {k: metric(summary, k) for k in keys}


def metric_label(key, unit=True):
    """'TTFT p99 (ms)' for ttft_p99; an unknown key is its own label."""
    label, u = METRICS[key][:2] if key in METRICS else (key, "")
    return "%s (%s)" % (label, u) if unit and u else label


def metric_unit(key):
    return METRICS[key][1] if key in METRICS else ""


# ---------------------------------------------------------------------------------------------
# Running tandem and reading its outputs

def tandem_run_cmd(tandem, workload, out, sets=(), backend=None, threads=0, trace="none"):
    """The `tandem run` command line: --quiet, --out OUT, --trace TRACE (None: tandem's default),
    --backend (None: the workload's), --clock wall on a real backend, --threads on the CPU one."""
    cmd = [tandem, "run", workload, "--quiet", "--out", out]
    if trace:
        cmd += ["--trace", trace]
    if backend:
        cmd += ["--backend", backend]
        if backend != "sim":
            cmd += ["--clock", "wall"]
        if backend == "cpu" and threads:
            cmd += ["--threads", str(threads)]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def read_summary(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def read_requests(run_dir):
    """requests.csv as a list of dicts (strings; empty cells are '')."""
    with open(os.path.join(run_dir, "requests.csv"), newline="") as f:
        return list(csv.DictReader(f))


def load_run(run_dir, label=None):
    return {"label": label or os.path.basename(os.path.normpath(run_dir)), "dir": run_dir,
            "summary": read_summary(run_dir), "requests": read_requests(run_dir)}


def run_tandem(tandem, workload, out, sets=(), backend=None, threads=0, trace="none", label=None, tool="tandem"):
    """Runs `tandem run` into `out` and loads the run (load_run); exits with tandem's stderr on failure.
    A measured run's warnings (summary.json: other work took its cores) go to stderr, naming the run."""
    cmd = tandem_run_cmd(tandem, workload, out, sets, backend, threads, trace)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("%s: %s failed (exit %d):\n%s" % (tool, " ".join(cmd), r.returncode, r.stderr))
    rec = load_run(out, label)
    for w in rec["summary"].get("warnings", []):
        progress("%s: WARNING: %s: %s" % (tool, out, w))
    return rec


def conditions_line(summary):
    """One line on the conditions a measured run ran under (summary.json's `conditions`), or None for
    a simulated run: 'load average 1.20 -> 1.35, other work took 4.2 % of its 2 cores' time (steal 0.0 %)'."""
    c = summary.get("conditions")
    if not isinstance(c, dict):
        return None

    def num(k, fmt="%.2f", scale=1.0):
        v = c.get(k)
        return fmt % (scale * v) if isinstance(v, (int, float)) else "?"
    return "load average %s -> %s, other work took %s %% of its %s cores' time (steal %s %%)" % (
        num("load_average_start"), num("load_average_end"), num("cores_taken_share", "%.1f", 100),
        c.get("cores_used", "?"), num("steal_share", "%.1f", 100))


def run_conditions(run_dirs):
    """Over measured run folders: (the largest share of its cores' time other work took, the runs
    that warned, the runs with conditions); (nan, [], 0) when none recorded them."""
    worst, warned, n = NAN, [], 0
    for d in run_dirs:
        try:
            s = read_summary(d)
        except (OSError, ValueError):
            continue
        c = s.get("conditions")
        if not isinstance(c, dict):
            continue
        n += 1
        t = c.get("cores_taken_share")
        if isinstance(t, (int, float)):
            worst = t if is_nan(worst) else max(worst, t)
        if s.get("warnings"):
            warned.append(d)
    return worst, warned, n


class Runner:
    """Runs of one workload into OUT/LABEL with common settings, a progress line per run on stderr
    ("[3/12] chunk=512 rate 8: 1.2 s") and a closing line saying where the runs are."""

    def __init__(self, tool, tandem, workload, out, backend=None, threads=0, sets=(), trace="none", total=0):
        self.tool, self.tandem, self.workload, self.out = tool, tandem, workload, out
        self.backend, self.threads, self.sets, self.trace = backend, threads, list(sets), trace
        self.total, self.done, self.labels, self.started = total, 0, [], time.time()

    def run(self, label, sets=(), what=None):
        self.done += 1
        n = "%d/%d" % (self.done, self.total) if self.total else str(self.done)
        progress("[%s] %s: " % (n, what or label), end="")
        t0 = time.time()
        try:
            rec = run_tandem(self.tandem, self.workload, os.path.join(self.out, label), self.sets + list(sets),
                             self.backend, self.threads, self.trace, label, self.tool)
        except SystemExit:
            progress("failed after %.1f s" % (time.time() - t0))
            raise
        progress("%.1f s" % (time.time() - t0))
        self.labels.append(label)
        return rec

    def where(self):
        files = "summary.json, requests.csv, steps.csv" + ("" if self.trace == "none" else ", trace")
        return "%d runs in %s/ (%s each; %.0f s in all)" % (len(self.labels), self.out.rstrip("/"), files,
                                                         time.time() - self.started)


def progress(msg, end="\n"):
    sys.stderr.write(msg + end)
    sys.stderr.flush()


def parse_resolved_yaml(text):
    """The block mappings of a resolved workload (DIR/workload.resolved.yaml, or what
    `tandem validate` prints) as {"model.max_model_len": "8192", "engine.policy": "continuous", ...}.

    A small reader for the YAML tandem emits, so the tools need no YAML package: `key: value`
    and `key:` lines nested by indentation; values are strings (unquoted); comments and blank
    lines are skipped, and so are sequences (`- ...` items and everything under them).
    """
    out, stack, skip_below = {}, [], None  # stack: (indent, key) of the open mappings
    for line in text.splitlines():
        body = line.strip()
        if not body or body.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip(" "))
        if skip_below is not None:
            if indent > skip_below or (indent == skip_below and body.startswith("- ")):
                continue
            skip_below = None
        if body.startswith("- ") or body == "-":
            skip_below = indent
            continue
        key, sep, value = body.partition(":")
        if not sep:
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [key.strip()])
        value = value.split(" #")[0].strip()
        if value:
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            out[path] = value
        else:
            stack.append((indent, key.strip()))
    return out


def read_resolved(run_dir):
    """The resolved configuration a run used (its workload.resolved.yaml): parse_resolved_yaml."""
    with open(os.path.join(run_dir, "workload.resolved.yaml")) as f:
        return parse_resolved_yaml(f.read())


def resolve_config(tandem, workload, sets=(), tool="tandem"):
    """The resolved configuration of a workload with --set overrides, before running it: the YAML
    `tandem validate` prints (the same as a run's workload.resolved.yaml), parse_resolved_yaml."""
    cmd = [tandem, "validate", workload] + [x for s in sets for x in ("--set", s)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("%s: %s failed (exit %d):\n%s" % (tool, " ".join(cmd), r.returncode, r.stderr))
    return parse_resolved_yaml(r.stdout)


# ---------------------------------------------------------------------------------------------
# Statistics

def percentile(values, p, method="nearest"):
    """The p-th percentile (0 < p <= 100) of values; nan when empty.
    nearest: the nearest-rank value, the ceil(p/100 * n)-th smallest (the bench tools);
    index:   the value at index min(n - 1, floor(p/100 * n)) of the sorted values (the step errors
             of tools/sim_error.py)."""
    v = sorted(values)
    if not v:
        return NAN
    n = len(v)
    if method == "nearest":
        return v[int(max(1, -(-n * p // 100))) - 1]
    if method == "index":
        return v[min(n - 1, int(n * p // 100))]
    raise ValueError("percentile method %r" % method)


def mean(values):
    values = list(values)
    return sum(values) / len(values) if values else NAN


def rel_error(simulated, measured):
    """(simulated - measured) / measured; nan when measured is 0 or either is missing."""
    try:
        return (simulated - measured) / measured if measured else NAN
    except TypeError:
        return NAN


def is_nan(x):
    return isinstance(x, float) and math.isnan(x)


# ---------------------------------------------------------------------------------------------
# Tables

def fmt_num(x, digits=4):
    """A number for a table: ints as they are, floats to `digits` significant digits in fixed
    point (no exponent; at most 6 decimals), '-' for None or nan."""
    if x is None or is_nan(x):
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    decimals = min(6, max(0, digits - 1 - int(math.floor(math.log10(abs(x))))))
    return "%.*f" % (decimals, x)


def fmt_pct(x, decimals=1, sign=True):
    """100 x as a percentage figure ('+3.1'), '-' for nan; the % goes in the column header."""
    if x is None or is_nan(x):
        return "-"
    return ("%+.*f" if sign else "%.*f") % (decimals, 100 * x)


def fmt_ratio(x, decimals=3):
    return "-" if x is None or is_nan(x) else "%.*f" % (decimals, x)


def format_table(header, rows, left=1, fmt=fmt_num, title=None):
    """A text table: a header row, then the rows; the first `left` columns are labels (left-aligned),
    the others right-aligned. Cells that are not strings go through fmt (a function, or a list of
    one per column, None for the default). Put the units in the header ('TTFT p99 (ms)')."""
    fmts = fmt if isinstance(fmt, (list, tuple)) else [fmt] * len(header)
    cells = [[c if isinstance(c, str) else (fmts[i] or fmt_num)(c) for i, c in enumerate(r)] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells if i < len(r)]) for i, h in enumerate(header)]

    def line(r):
        return "  ".join(c.ljust(widths[i]) if i < left else c.rjust(widths[i])
                         for i, c in enumerate(r)).rstrip()
    out = ([title] if title else []) + [line(header)] + [line(r) for r in cells]
    return "\n".join(out)


def metrics_table(runs, keys, title=None):
    """Metrics side by side: one row per metric key (label and unit), one column per run.
    runs: {label: {key: value}}."""
    return format_table(["metric"] + list(runs), [[metric_label(k)] + [r.get(k) for r in runs.values()]
                                                   for k in keys], title=title)


def ratio_table(runs, keys, base, title=None):
    """Each run's metrics over those of run `base` (x), one column per run but the base."""
    others = [l for l in runs if l != base]
    rows = []
    for k in keys:
        b = runs[base].get(k)
        rows.append([metric_label(k, unit=False)] + [fmt_ratio(runs[l][k] / b if b else NAN) for l in others])
    return format_table(["metric"] + ["%s (x)" % l for l in others], rows,
                        title=title or "ratios vs %s (x):" % base)


def error_table(configs, keys, title=None, config_header="config"):
    """The simulated-vs-measured error table: one row per config and metric with the unit,
    measured, simulated and the relative error 100 (S - M) / M (%).

    configs: [(label, measured, simulated)], each a {key: value} dict; a measured value may be a
    list of repetitions: the table then shows their median, and their spread (max - min) / median
    in a column of its own, and the error is against the median.
    Returns (text, largest |error| as a fraction, nan when none)."""
    spread = any(isinstance(m.get(k), (list, tuple)) for _, m, _ in configs for k in keys)
    rows, worst = [], NAN
    for label, measured, simulated in configs:
        for k in keys:
            m, s, sp = measured.get(k), simulated.get(k), NAN
            if isinstance(m, (list, tuple)):
                vals = [v for v in m if v is not None]
                m = statistics.median(vals) if vals else NAN
                sp = (max(vals) - min(vals)) / m if vals and m else NAN
            err = rel_error(s, m)
            if not is_nan(err):
                worst = abs(err) if is_nan(worst) else max(worst, abs(err))
            rows.append([label, metric_label(k, unit=False), metric_unit(k), m]
                        + ([fmt_pct(sp, sign=False)] if spread else []) + [s, fmt_pct(err)])
    header = [config_header, "metric", "unit", "measured"] + (["spread %"] if spread else []) + ["simulated", "error %"]
    return format_table(header, rows, left=3, title=title), worst


# ---------------------------------------------------------------------------------------------
# Capacity

def capacity(results):
    """results: [(rate, meets the SLOs)]. Returns (best, fail_above, fails_below): the highest rate
    meeting the SLOs (None: none does), the lowest failing rate above it (None: none tried), and the
    failing rates below it (a sweep that is not monotonic)."""
    ok = [r for r, good in results if good]
    bad = sorted(r for r, good in results if not good)
    if not ok:
        return None, (bad[0] if bad else None), []
    best = max(ok)
    above = [r for r in bad if r > best]
    return best, (above[0] if above else None), [r for r in bad if r < best]


def capacity_text(results, unit="req/s"):
    """One line on the capacity that results show, with the resolution of the grid of rates."""
    best, above, below = capacity(results)
    if best is None:
        text = ("none: the lowest rate tried, %g %s, fails" % (above, unit)) if above is not None else "none (no runs)"
    elif above is None:
        text = "%g %s: capacity at least %g %s (the highest rate tried)" % (best, unit, best, unit)
    else:
        text = "%g %s: capacity between %g and %g %s (the grid's resolution)" % (best, unit, best, above, unit)
    if below:
        text += "; not monotonic: fails at %s %s below it" % (", ".join("%g" % r for r in below), unit)
    return text


def capacity_sweep(runner, configs, rates, slos, columns, config_header="config"):
    """Runs each config at each arrival rate (requests.arrival.rate, into OUT/LABEL@RATE) and prints
    a table of the `columns` metrics with whether each run meets the SLOs, then per config the
    highest rate meeting them (capacity_text). configs: [(label, sets)]; slos: [(metric key, limit)]:
    a run meets them when each metric <= its limit. Returns {label: highest rate or None}."""
    rows, best, texts = [], {}, {}
    for label, sets in configs:
        results = []
        for rate in rates:
            rec = runner.run("%s@%g" % (label, rate), list(sets) + ["requests.arrival.rate=%g" % rate],
                             what="%s rate %g" % (label, rate))
            s = rec["summary"]
            ok = all(metric(s, k) <= limit for k, limit in slos)
            results.append((rate, ok))
            rows.append([label, rate] + [metric(s, k) for k in columns] + ["ok" if ok else "-"])
        best[label], texts[label] = capacity(results)[0], capacity_text(results)
    print(format_table([config_header, "rate (req/s)"] + [metric_label(k) for k in columns] + ["SLOs met"], rows,
                       fmt=[None, "{:g}".format] + [None] * (len(columns) + 1)))
    print("highest rate meeting %s (rates tried: %s req/s):" % (
        " and ".join("%s <= %g %s" % (metric_label(k, unit=False), v, metric_unit(k)) for k, v in slos),
        ", ".join("%g" % r for r in rates)))
    width = max(len(l) for l, _ in configs)
    for label, _ in configs:
        print("  %-*s  %s" % (width, label, texts[label]))
    return best


def parse_rates(text):
    return [float(r) for r in text.split(",") if r.strip()]


# ---------------------------------------------------------------------------------------------
# Plotting

def pyplot(tool):
    """matplotlib.pyplot with the Agg backend. A python3 earlier on PATH (pyenv, a venv) may lack
    Debian's matplotlib: the tool then runs again under /usr/bin/python3."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3"):
            os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
        sys.exit("%s: plots need matplotlib (apt-get install python3-matplotlib, or tools/setup)" % tool)


def hist_cdf(hist):
    """A summary.json histogram ([[lo, hi, count], ...], e.g. itl_histogram_ms) as a step CDF
    (xs, ys): each bin's upper edge and the share of the values up to it; ([], []) when empty."""
    total = sum(b[2] for b in hist)
    xs, ys, seen = [], [], 0
    for _, hi, n in (hist if total else []):
        seen += n
        xs.append(hi)
        ys.append(seen / total)
    return xs, ys


def same_data(curves):
    """curves: [(label, data)]. {label: [the labels of the other curves with equal data]}: two runs
    that behave the same draw the same line, one on top of the other, and a legend should say so."""
    return {l: [o for o, d2 in curves if o != l and d2 == d] for l, d in curves}


def read_steps(run_dir):
    """steps.csv as [(start_s, elapsed_ms, prefill tokens, decode tokens)], one tuple per step."""
    with open(os.path.join(run_dir, "steps.csv"), newline="") as f:
        return [(float(r["start_s"]), float(r["elapsed_ms"]), int(r["n_tokens"]) - int(r["n_decode"]),
                 int(r["n_decode"])) for r in csv.DictReader(f)]


def steps_between(steps, lo, hi):
    """The steps (read_steps) that run during [lo, hi] s: start by hi and end from lo on."""
    return [s for s in steps if s[0] <= hi and s[0] + s[1] / 1000.0 >= lo]


def fit_window(lo, hi, steps):
    """A timeline window [lo, hi] s on a run (read_steps): itself when a step runs in it; else a
    window as long that ends where the run ends (from 0 when the run is shorter), e.g. --window
    60,70 on a 17 s run: 7-17 s. Returns (lo, hi, moved)."""
    if not steps or steps_between(steps, lo, hi):
        return lo, hi, False
    end = max(s[0] + s[1] / 1000.0 for s in steps)
    return max(0.0, end - (hi - lo)), end, True


def zoom_window(steps, lo, hi, min_span=0.3, stall_share=0.25):
    """A window short enough to tell a run's steps apart, inside [lo, hi] s: around the step with
    the most prefill tokens there (a long prompt's stall; of equals the longest, then the first), which starts
    `stall_share` of the way in; as long as 4 of that step and at least min_span s (or [lo, hi]
    when shorter). Returns (zoom lo, zoom hi)."""
    inside = steps_between(steps, lo, hi)
    if hi - lo <= min_span or not inside:
        return lo, min(hi, lo + min_span)
    stall = max(inside, key=lambda s: (s[2], s[1], -s[0]))
    span = min(hi - lo, max(min_span, 4 * stall[1] / 1000.0))
    z0 = min(max(lo, stall[0] - stall_share * span), hi - span)
    return z0, z0 + span


# ---------------------------------------------------------------------------------------------
# Simulated vs measured for a bench tool (tools/stage2-sim-vs-measured, tools/stage3-sim-vs-measured)

CPU_CALIBRATION = ["workloads/cpu_calibrate_tiny.yaml", "workloads/cpu_calibrate_tiny_static.yaml",
                   "workloads/cpu_calibrate_tiny_chunked.yaml"]


def bench_sim_vs_measured(tool, bench, workload, bench_args, keys, base, ratio_keys, out,
                          reuse_profile=False):
    """On the CPU backend: the linear-fit profile from CPU_CALIBRATION (`tandem calibrate` without
    --model; kept when reuse_profile and OUT/profile.yaml exists), then tools/BENCH on the workload
    measured (--backend cpu, wall clock) and simulated (--backend sim) with that profile, and the
    error table of `keys` per config, and the measured ratios of `ratio_keys` against config `base`.
    Environment: TANDEM (default build/tandem), THREADS (CPU backend threads, 0: all cores)."""
    tandem, threads = os.environ.get("TANDEM", "build/tandem"), os.environ.get("THREADS", "0")
    here = os.path.dirname(os.path.realpath(__file__))
    os.makedirs(out, exist_ok=True)
    profile = os.path.join(out, "profile.yaml")
    if not (reuse_profile and os.path.isfile(profile)):
        cmd = [tandem, "calibrate", "--backend", "cpu"] + [x for w in CPU_CALIBRATION for x in ("--workload", w)]
        cmd += (["--threads", threads] if threads != "0" else []) + ["--out", profile]
        progress("[calibrate] linear fit on %d CPU workloads (%s/calibrate.txt): " % (len(CPU_CALIBRATION), out), end="")
        t0 = time.time()
        with open(os.path.join(out, "calibrate.txt"), "w") as f:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
        progress("%.0f s" % (time.time() - t0))
        with open(os.path.join(out, "calibrate.txt")) as f:
            tail = f.read().splitlines()[-2:]
        print("\n".join(tail))
        if rc != 0:
            sys.exit("%s: %s failed (exit %d)" % (tool, " ".join(cmd), rc))
    runs = {}
    for kind, backend in (("measured", "cpu"), ("simulated", "sim")):
        cmd = [os.path.join(here, bench), "--tandem", tandem, "--backend", backend]
        cmd += (["--threads", threads] if backend == "cpu" else []) + list(bench_args)
        cmd += ["--set", "hardware=" + profile, "--out", os.path.join(out, kind),
                "--json", os.path.join(out, kind + ".json"), workload]
        progress("[%s] tools/%s --backend %s (table: %s/%s.txt)" % (kind, bench, backend, out, kind))
        with open(os.path.join(out, kind + ".txt"), "w") as f:
            rc = subprocess.run(cmd, stdout=f).returncode  # its progress lines go to stderr
        if rc != 0:
            sys.exit("%s: %s failed (exit %d)" % (tool, " ".join(cmd), rc))
        with open(os.path.join(out, kind + ".json")) as f:
            runs[kind] = json.load(f)["runs"]
    m, s = runs["measured"], runs["simulated"]
    text, worst = error_table([(c, m[c], s[c]) for c in m], keys,
                              title="measured (CPU backend) vs simulated with the fitted profile %s; "
                                    "error = (simulated - measured) / measured" % profile)
    text += "\nlargest |error|: %s%%\n\n" % fmt_pct(worst, sign=False)
    text += ratio_table(m, ratio_keys, base, title="measured, against %s (x):" % base)
    print(text)
    with open(os.path.join(out, "errors.txt"), "w") as f:
        f.write(text + "\n")
    print("wrote %s/: profile.yaml, calibrate.txt, errors.txt (this table), measured/ and simulated/ "
          "(runs), measured.{txt,json}, simulated.{txt,json} (the bench tables)" % out.rstrip("/"))


# ---------------------------------------------------------------------------------------------
# A time-kept run of steps: a prepared call on a lent device (tools/device-pending), where the
# call has a hard wall-clock limit and what each step measured must survive a later one running out


def doctest_counts(text):
    """The test-case counts in doctest output, summed over the runs it holds (one per process):
    {"cases", "passed", "failed", "skipped", "assertions", "assertions_failed"}, or None when no
    run printed its summary (it exited 77 before doctest, or was killed first)."""
    found = re.findall(r"^\[doctest\] test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed"
                       r"(?:\s*\|\s*(\d+) skipped)?", text, re.M)
    if not found:
        return None
    asserts = re.findall(r"^\[doctest\] assertions:\s*(\d+)\s*\|\s*\d+ passed\s*\|\s*(\d+) failed", text, re.M)
    return {"cases": sum(int(f[0]) for f in found), "passed": sum(int(f[1]) for f in found),
            "failed": sum(int(f[2]) for f in found), "skipped": sum(int(f[3] or 0) for f in found),
            "assertions": sum(int(a[0]) for a in asserts), "assertions_failed": sum(int(a[1]) for a in asserts)}


def doctest_failed_cases(text):
    """The names of the test cases doctest reported a failure in (each once, in order)."""
    names = []
    for name in re.findall(r"^TEST CASE:\s+(.*?)\s*$", text, re.M):
        if name not in names:
            names.append(name)
    return names


def device_env(build, root="."):
    """The environment for a binary of a device build (tools/device-check --prepare), as the
    device scripts set it: the build's bundled libraries, NCCL's Python wheel where python3
    has one, CUDA's lib64, then what LD_LIBRARY_PATH held."""
    parts = [os.path.join(os.path.abspath(root), build, "bundle")]
    try:
        import nvidia.nccl  # a namespace package: __path__, not __file__
        parts += [os.path.join(p, "lib") for p in nvidia.nccl.__path__]
    except ImportError:
        pass
    parts.append("/usr/local/cuda/lib64")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join(parts + ([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else []))
    return env


class TimedStep:
    """One step of a time-kept run.

    name:     its row in the table; limit_s: the seconds it may run before it is killed (exit 124);
    command:  command(ctx) -> the argument list, run from the root with $OUT set to its folder
              (ctx.folder, OUT/steps/FOLDER; steps may share one) and its output in
              ctx.folder/SLUG.log (ctx.log); ctx.results: the results of the steps before it, by name;
    figures:  figures(ctx, result) -> one line of key figures for the table (read from its folder);
    stretch:  it may use all that is left of the budget when that is more than limit_s (a last step);
    keep:     files of its folder copied to OUT after it (what should come back as a file of its own).
    A result: {"status", "rc", "limit", "used", "figures", "folder", "log", "command" (if started)}.
    """

    def __init__(self, name, limit_s, command, figures=None, folder=None, stretch=False, keep=()):
        self.name, self.limit_s, self.command, self.figures = name, limit_s, command, figures
        self.slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")
        self.folder, self.stretch, self.keep = folder or self.slug, stretch, tuple(keep)


class StepContext:
    def __init__(self, step, steps_dir, results):
        self.steps_dir = steps_dir
        self.folder = os.path.join(steps_dir, step.folder)
        self.log = os.path.join(self.folder, step.slug + ".log")
        self.results = results


def session_pids(sid):
    """The live processes of session `sid` (Linux /proc; zombies left out): what a step started,
    however deep."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after the command name: state ppid pgrp session
            if int(fields[3]) == sid and fields[0] != "Z":
                pids.append(int(d))
        except (OSError, IndexError, ValueError):
            pass
    return pids


def end_session(sid, grace_s):
    """SIGTERM to every process of session `sid` (the tools below forward it: timeout, bash),
    then SIGKILL to those still there after grace_s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = session_pids(sid)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if sig == signal.SIGTERM and pids:
            end = time.monotonic() + grace_s
            while time.monotonic() < end and session_pids(sid):
                time.sleep(0.05)


class _Stopped(Exception):
    pass


class TimeKeeper:
    """Runs steps in order within a budget of seconds counted from its start: a step runs only if
    its limit fits in what is left (else it is skipped, and said so), is killed at its limit
    (exit 124; what it wrote is kept), and after each step the table (OUT/summary.txt) and an
    archive of OUT (OUT/ARCHIVE) are written again, so that a call cut short still returns what the
    steps before measured. SIGTERM or SIGINT stops the step running, then the table and the archive
    are written. At the end the steps' folder is removed (OUT/steps, archived): a device call returns
    only a few files; files the tool puts in OUT itself stay.

    Statuses in the table: the exit status (0, 1, 77: no device, 124: killed at its limit, ...),
    "skipped" (did not fit), "stopped" (a signal), "not run" (after a stop)."""

    def __init__(self, steps, budget_s, out, root=".", env=None, archive="steps.tar.gz", title=None,
                 report=None, grace_s=2.0, clock=time.monotonic, log=None):
        self.steps, self.budget_s, self.out, self.root = steps, budget_s, out, root
        self.env, self.archive, self.title, self.report = env, archive, title, report
        self.grace_s, self.clock = grace_s, clock
        self.log = log or (lambda msg: progress(msg))
        self.steps_dir = os.path.join(out, "steps")
        self.results, self.text = {}, ""

    def limits_line(self):
        """limits: NAME LIMIT s, ...; sum N s <= BUDGET (a stretch step: 'or what is left')."""
        parts = ["%s %d s%s" % (s.name, s.limit_s, " (or what is left, if more)" if s.stretch else "")
                 for s in self.steps]
        total = sum(s.limit_s for s in self.steps)
        return "limits: %s; sum %d s %s %d" % (", ".join(parts), total, "<=" if total <= self.budget_s else ">",
                                                self.budget_s)

    def plan(self):
        """The dry run: each step, its limit, its folder and its command (from no results)."""
        lines = [self.limits_line()]
        for i, s in enumerate(self.steps, 1):
            ctx = StepContext(s, self.steps_dir, {})
            cmd = s.command(ctx)
            lines.append("%2d. %s (limit %d s%s): OUT=%s %s" % (i, s.name, s.limit_s, ", stretches" if s.stretch else "",
                                                                ctx.folder, shlex.join(cmd)))
        return "\n".join(lines)

    def _note(self, msg):
        line = "%s %s" % (time.strftime("%H:%M:%S", time.gmtime()), msg)
        self.log(line)
        with open(os.path.join(self.out, "progress.txt"), "a") as f:
            f.write(line + "\n")

    def _stop(self, signum, frame):
        raise _Stopped(signal.Signals(signum).name)

    def _run_one(self, step, ctx, limit):
        os.makedirs(ctx.folder, exist_ok=True)
        env = dict(self.env if self.env is not None else os.environ)
        env["OUT"] = os.path.abspath(ctx.folder)
        cmd = step.command(ctx)
        self._note("%s (limit %.0f s): %s" % (step.name, limit, shlex.join(cmd)))
        t0 = self.clock()
        with open(ctx.log, "ab") as logf:
            try:
                p = subprocess.Popen(cmd, cwd=self.root, env=env, stdout=logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as e:
                logf.write(("cannot start %s: %s\n" % (cmd[0], e)).encode())
                return {"status": "127", "rc": 127, "used": self.clock() - t0, "command": cmd}
            try:
                rc = p.wait(timeout=limit)
                status = str(rc) if rc >= 0 else "signal %d" % -rc
            except subprocess.TimeoutExpired:
                rc, status = 124, "124"
            except _Stopped:
                rc, status = None, "stopped"
            finally:
                end_session(p.pid, self.grace_s)  # what it left running; all of it at its limit
                p.wait()
            if status == "124":
                logf.write(("\n[time keeper] killed at its limit of %.0f s\n" % limit).encode())
        return {"status": status, "rc": rc, "used": self.clock() - t0, "command": cmd}

    def table(self):
        rows, figs = [], []
        for s in self.steps:
            r = self.results.get(s.name)
            if r is None:
                rows.append([s.name, s.limit_s, "-", "pending"])
                figs.append("")
                continue
            rows.append([s.name, r["limit"], "-" if r["used"] is None else "%.1f" % r["used"], r["status"]])
            figs.append(r.get("figures", ""))
        text = format_table(["step", "limit (s)", "used (s)", "exit"], rows, fmt=[None, "{:.0f}".format, None, None])
        lines = text.splitlines()
        width = max(len(l) for l in lines)
        out = [lines[0].ljust(width) + "  key figures"]
        out += [l.ljust(width) + ("  " + f if f else "") for l, f in zip(lines[1:], figs)]
        used = sum(r["used"] or 0 for r in self.results.values())
        out.append("sum of the limits %d s (budget %d s); used %.1f s in the steps" % (
            sum(s.limit_s for s in self.steps), self.budget_s, used))
        return "\n".join(([self.title] if self.title else []) + out)

    def summary_text(self):
        text = self.table()
        if self.report:
            try:
                extra = self.report(self.results)
            except Exception as e:  # a report that cannot be read must not lose the table
                extra = "report unreadable: %s: %s" % (e.__class__.__name__, e)
            if extra:
                text += "\n\n" + extra
        return text

    def _write(self):
        self.text = self.summary_text()  # what summary.txt holds (the steps' folder goes at the end)
        with open(os.path.join(self.out, "summary.txt"), "w") as f:
            f.write(self.text + "\n")
        tmp = os.path.join(self.out, self.archive + ".tmp")
        with tarfile.open(tmp, "w:gz") as tar:
            for entry in sorted(os.listdir(self.out)):
                if entry not in (self.archive, self.archive + ".tmp"):
                    tar.add(os.path.join(self.out, entry), arcname=entry)
        os.replace(tmp, os.path.join(self.out, self.archive))

    def run(self):
        """Runs the steps; returns {name: result} (status, rc, limit, used, figures)."""
        os.makedirs(self.steps_dir, exist_ok=True)
        start = self.clock()
        old = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        stopped = False
        try:
            self._note(self.limits_line())
            for step in self.steps:
                ctx = StepContext(step, self.steps_dir, self.results)
                left = self.budget_s - (self.clock() - start)
                limit = max(step.limit_s, left) if step.stretch else step.limit_s
                if stopped:
                    r = {"status": "not run", "rc": None, "used": None, "figures": "stopped before it"}
                elif step.limit_s > left:
                    r = {"status": "skipped", "rc": None, "used": None,
                         "figures": "would not fit: %.0f s left of %d s" % (max(left, 0), self.budget_s)}
                    self._note("%s: skipped (limit %d s, %.0f s left)" % (step.name, step.limit_s, max(left, 0)))
                else:
                    try:
                        r = self._run_one(step, ctx, limit)
                    except _Stopped:  # before its process started
                        r = {"status": "stopped", "rc": None, "used": None}
                    stopped = r["status"] == "stopped"
                    self._note("%s: exit %s, %.1f s" % (step.name, r["status"], r["used"] or 0))
                r["limit"] = limit if r["status"] not in ("skipped", "not run") else step.limit_s
                r["folder"], r["log"] = ctx.folder, ctx.log
                for name in step.keep:
                    if os.path.isfile(os.path.join(ctx.folder, name)):
                        shutil.copy(os.path.join(ctx.folder, name), os.path.join(self.out, os.path.basename(name)))
                if step.figures and r["status"] not in ("skipped", "not run"):
                    try:
                        r["figures"] = step.figures(ctx, r)
                    except Exception as e:
                        r["figures"] = "figures unreadable: %s: %s" % (e.__class__.__name__, e)
                r.setdefault("figures", "")
                self.results[step.name] = r
                self._write()
        except _Stopped:
            self._note("stopped between steps")
            for step in self.steps:
                self.results.setdefault(step.name, {"status": "not run", "rc": None, "used": None,
                                                    "limit": step.limit_s, "figures": "stopped before it"})
        finally:
            for sig, h in old.items():
                signal.signal(sig, h)
        self._write()  # the table and the archive, the steps' folder in it
        shutil.rmtree(self.steps_dir, ignore_errors=True)
        return self.results


# ---------------------------------------------------------------------------------------------
# Command line: compare

def listening_port(proc):
    """The port a `tandem serve --listen HOST:0` process (stderr piped, text) says it listens on,
    None if it ends first. After that line a thread drains its stderr, so it never blocks on a full
    pipe."""
    import threading
    for line in proc.stderr:
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return int(m.group(1))
    return None


def serve_start(tool, tandem, workload, backend, out, serve_args=()):
    """Starts `tandem serve WORKLOAD --backend B --listen 127.0.0.1:0 --out OUT --trace none SERVE_ARGS`
    and waits for its `listening on` line. Returns (the process, its base URL, the model id GET /v1/models
    names); exits naming `tool` when the server does not start. After that line a thread drains the
    server's stderr, so it never blocks on a full pipe."""
    import http.client
    proc = subprocess.Popen([tandem, "serve", workload, "--backend", backend, "--listen", "127.0.0.1:0",
                             "--out", out, "--trace", "none", *serve_args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    port = listening_port(proc)
    if port is None:
        proc.kill()
        sys.exit("%s: tandem serve %s did not start (exit %s)" % (tool, workload, proc.wait()))
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/v1/models")
    model = json.loads(c.getresponse().read())["data"][0]["id"]
    c.close()
    return proc, "http://127.0.0.1:%d" % port, model


def serve_stop(proc):
    """Stops `tandem serve` with SIGINT, as a user would: it then writes its --out folder (requests.csv,
    summary.json, served_workload.yaml)."""
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=300)


def replay_served(tandem, served, sim):
    """`tandem run` of the arrivals `tandem serve` recorded (served/served_workload.yaml), in simulated
    time, into `sim`."""
    subprocess.run([tandem, "run", os.path.join(served, "served_workload.yaml"), "--out", sim, "--quiet",
                    "--trace", "none"], check=True)


def client_served_sim_table(client_name, client, served, sim, table):
    """Prints TTFT, TPOT and ITL (mean, p50, p99, ms) as a benchmark client measured them (`client`: its
    result's mean_ttft_ms, median_ttft_ms, p99_ttft_ms ... keys, as vLLM's and SGLang's clients both
    write them), as tandem recorded them (served/summary.json) and as `tandem run` of the recorded
    arrivals predicts them (sim/summary.json); appends the rows to table["rows"]."""
    rec, pred = read_summary(served), read_summary(sim)
    print(f"{'ms':<34} {'mean':>9}  {'p50':>9}  {'p99':>9}")
    for name, key in (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl")):
        for who, m in ((f"{name} {client_name}", {"mean": client.get(f"mean_{key}_ms"),
                                                  "p50": client.get(f"median_{key}_ms"),
                                                  "p99": client.get(f"p99_{key}_ms")}),
                       (f"{name} tandem served (record)", rec[f"{key}_ms"]),
                       (f"{name} tandem run (simulated)", pred[f"{key}_ms"])):
            vals = [m.get(k) for k in ("mean", "p50", "p99")]
            table["rows"].append({"metric": who, "mean": vals[0], "p50": vals[1], "p99": vals[2]})
            print(f"{who:<34} " + "  ".join(f"{v:9.2f}" if v is not None else f"{'-':>9}" for v in vals))


def compare_main(argv):
    ap = argparse.ArgumentParser(prog="tandem_tools.py compare",
                                 description="Simulated vs measured run folders: the error table.")
    ap.add_argument("pairs", nargs="+", metavar="LABEL=MEASURED_DIR,SIMULATED_DIR")
    ap.add_argument("--title")
    ap.add_argument("--metrics", default="ttft_mean,ttft_p50,ttft_p99,tpot_mean,tpot_p50,tpot_p99",
                    help="comma-separated metric keys (default: %(default)s)")
    ap.add_argument("--ratio", metavar="A/B", help="also config A over config B, measured and simulated")
    a = ap.parse_args(argv)
    keys = [k for k in a.metrics.split(",") if k]
    for k in keys:
        if k not in METRICS:
            ap.error("unknown metric %r (known: %s)" % (k, ", ".join(METRICS)))
    configs, missing = [], []
    for pair in a.pairs:
        label, sep, dirs = pair.partition("=")
        m_dir, sep2, s_dir = dirs.partition(",")
        if not sep or not sep2:
            ap.error("%r is not LABEL=MEASURED_DIR,SIMULATED_DIR" % pair)
        got = []
        for d in (m_dir, s_dir):
            try:
                got.append(summary_metrics(read_summary(d), keys))
            except (OSError, ValueError) as e:
                missing.append("%s: no run in %s (%s)" % (label, d, e.__class__.__name__))
        if len(got) == 2:
            configs.append((label, got[0], got[1]))
    if configs:
        text, worst = error_table(configs, keys, title=a.title)
        print(text)
        print("largest |error|: %s%%" % fmt_pct(worst, sign=False))
    elif a.title:
        print(a.title)
    for line in missing:
        print(line)
    if a.ratio and configs:
        num, _, den = a.ratio.partition("/")
        byl = {l: (m, s) for l, m, s in configs}
        if num in byl and den in byl:
            rows = [[metric_label(k, unit=False)] + [fmt_ratio(byl[num][i][k] / byl[den][i][k]
                                                               if byl[den][i][k] else NAN) for i in (0, 1)]
                    for k in keys]
            rows = [r for r in rows if r[1:] != ["-", "-"]]  # e.g. a hit rate over caching off's 0
            print(format_table(["metric", "measured %s/%s (x)" % (num, den), "simulated %s/%s (x)" % (num, den)], rows))
    return 0


def conditions_main(argv):
    """conditions RUN_DIR...: each measured run's conditions line and warnings; exit 0."""
    for d in argv:
        try:
            s = read_summary(d)
        except (OSError, ValueError) as e:
            print("%s: no summary.json (%s)" % (d, e.__class__.__name__))
            continue
        print("%s: measured under: %s" % (d, conditions_line(s) or "not measured (a simulated run)"))
        for w in s.get("warnings", []):
            print("%s: WARNING: %s" % (d, w))
    return 0


def main(argv):
    if argv and argv[0] == "compare":
        return compare_main(argv[1:])
    if argv and argv[0] == "conditions":
        return conditions_main(argv[1:])
    print(__doc__)
    return 0 if argv and argv[0] in ("-h", "--help") else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
