#!/usr/bin/env python3
"""Simulated vs measured: the error table of tools/sim-vs-measured and tools/device-calibrate,
judged against the machine's own noise.

  tools/sim_error.py [--json FILE] CASE_DIR...   each CASE_DIR holds measured_1..N/ and simulated/ run folders
  tools/sim_error.py --max-spread CASE_DIR       prints the largest measured spread of the case (a fraction)

For each case: TTFT and TPOT (mean, p50, p90, p99) and ITL (p50, p90, p99) measured (median of the
repetitions, with their spread (max - min) / median) and simulated, the simulation's error against
the measured median, and the verdict. The target is the machine's noise floor: |error| within
max(5 %, spread) for a mean or a median (p50) and max(10 %, spread) for a tail (p90, p99). Medians
are the figures to trust on a shared machine: a mean or a p99 follows the few steps another
process preempted, a median does not. A figure whose spread is above 15 % is "noisy": it is shown
but not counted either way (tools/sim-vs-measured measures such a case again first). A figure the
summaries do not hold (an older summary.json) is shown as "-" and not counted. A case with one
measured run has no spread: its target is the fixed floor, and the verdict says so.
Then, over every measured repetition, the per-step prediction error (steps.csv: predicted_ms,
the cost model's price of the step, against the time the step held its instance: from its start
to the next step's, for steps followed at once by another; the executor's compute plus the
engine's host work after it, which a profile with served traffic prices as `loop_gap_us`) by
kind: decode-only, prefill-only, mixed; median, p90 and max of |error|, the median signed
error (positive: priced high), and the median share of that time the loop spent outside the
executor (steps.csv host_ms, where measured). Beside the runs' conditions, each run's speed
against the profile: the median over its steps of compute (elapsed_ms) over price (predicted_ms);
every run of a case is priced by the same profile, so their spread is the machine's own speed.
Standard library only (tools/tandem_tools.py).
"""
import csv
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import tandem_tools as tt  # noqa: E402

KEYS = ["ttft_mean", "ttft_p50", "ttft_p90", "ttft_p99", "tpot_mean", "tpot_p50", "tpot_p90", "tpot_p99",
        "itl_p50", "itl_p90", "itl_p99"]
FLOOR = {"mean": 0.05, "p50": 0.05, "p90": 0.10, "p99": 0.10}  # the fixed part of the target, by statistic
NOISY = 0.15                         # a measured spread above this is not counted


def floor_of(key):
    return FLOOR[key.rsplit("_", 1)[1]]


def spread_of(values):
    """(max - min) / median of the measured repetitions; nan with fewer than two."""
    vals = [v for v in values if v is not None and not tt.is_nan(v)]
    if len(vals) < 2:
        return tt.NAN
    m = statistics.median(vals)
    return (max(vals) - min(vals)) / m if m else tt.NAN


def judge(error, spread, key):
    """(target, verdict) of one figure: verdict is met, missed, noisy (spread above NOISY: not
    counted) or '-' (no error to judge). With no spread (one run) the target is the floor."""
    target = floor_of(key) if tt.is_nan(spread) else max(floor_of(key), spread)
    if tt.is_nan(error):
        return target, "-"
    if not tt.is_nan(spread) and spread > NOISY:
        return target, "noisy"
    return target, "met" if abs(error) <= target else "missed"


def held_steps(run_dirs):
    """(kind, row, held_ms) of the measured runs' steps: held_ms is the time the step held its
    instance, from its start to the start of the instance's next step, for steps followed at once
    by another (the next is not after_idle); None for the others and for steps.csv files without
    start_s/after_idle."""
    for d in run_dirs:
        path = os.path.join(d, "steps.csv")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            rows = list(csv.DictReader(f))
        if not rows or "predicted_ms" not in rows[0]:
            continue
        spans = "start_s" in rows[0] and "after_idle" in rows[0]
        next_of = {}  # row index -> the index of the same instance's next step
        if spans:
            last = {}
            for i, row in enumerate(rows):
                inst = row.get("instance", "0")
                if inst in last:
                    next_of[last[inst]] = i
                last[inst] = i
        for i, row in enumerate(rows):
            n_pre, n_dec = int(row["n_prefill"]), int(row["n_decode"])
            kind = "decode" if n_pre == 0 else ("prefill" if n_dec == 0 else "mixed")
            j = next_of.get(i)
            held_ms = None
            if j is not None and rows[j]["after_idle"] in ("0", ""):
                held_ms = 1000.0 * (float(rows[j]["start_s"]) - float(row["start_s"]))
            yield kind, row, held_ms if (held_ms or 0) > 0 else None, spans


def step_errors(run_dirs):
    """{kind: [signed error]} of the measured runs' steps: the price (predicted_ms) against the time
    the step held its instance (held_steps). That span is what a simulated step occupies: a profile
    that learned the engine's host work between steps (loop_gap_us) prices it into each step, so
    comparing with elapsed_ms (the executor's compute alone) would report that host work as an
    error of the price. A step followed by an idle spell or by none is left out. steps.csv files
    without start_s/after_idle fall back to their pred_error (price vs compute)."""
    kinds = {"decode": [], "prefill": [], "mixed": []}
    for kind, row, held_ms, spans in held_steps(run_dirs):
        if not spans:
            if "pred_error" in row:
                kinds[kind].append(float(row["pred_error"]))
        elif held_ms is not None:
            kinds[kind].append(float(row["predicted_ms"]) / held_ms - 1.0)
    return kinds


def run_speed(run_dir):
    """A measured run's speed against the profile: the median over its steps of the executor's
    compute (elapsed_ms) over the price (predicted_ms). The same profile priced every run of a
    case, so how far these differ between runs is how far the machine's own speed moved: the
    same arithmetic, taking longer or shorter. None without steps.csv or prices."""
    path = os.path.join(run_dir, "steps.csv")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        ratios = [float(r["elapsed_ms"]) / float(r["predicted_ms"]) for r in csv.DictReader(f)
                  if float(r.get("predicted_ms") or 0) > 0]
    return statistics.median(ratios) if ratios else None


def host_shares(run_dirs):
    """{kind: [host_ms / held_ms]}: the share of a back-to-back step's time on its instance that was
    the loop's own work outside the executor (steps.csv host_ms, measured on real backends)."""
    kinds = {"decode": [], "prefill": [], "mixed": []}
    for kind, row, held_ms, _ in held_steps(run_dirs):
        if held_ms is not None and row.get("host_ms"):
            kinds[kind].append(float(row["host_ms"]) / held_ms)
    return kinds


def measured_dirs(case, failed=None):
    """The case's measured runs that finished (a summary.json); those that did not go to `failed`."""
    out = []
    for d in sorted((d for d in os.listdir(case) if d.startswith("measured_")),
                    key=lambda d: int(d.split("_")[1]) if d.split("_")[1].isdigit() else 0):
        if os.path.exists(os.path.join(case, d, "summary.json")):
            out.append(d)
        elif failed is not None:
            failed.append(os.path.join(case, d))
    return out


def case_figures(case):
    """{key: (measured repetitions, simulated)} of a case folder, or None when it has no runs."""
    measured = measured_dirs(case) if os.path.isdir(case) else []
    if not measured or not os.path.isdir(os.path.join(case, "simulated")):
        return None
    ms = [tt.read_summary(os.path.join(case, d)) for d in measured]
    sim = tt.read_summary(os.path.join(case, "simulated"))
    return {k: ([tt.metric(m, k) for m in ms], tt.metric(sim, k)) for k in KEYS}


def max_spread(case):
    """The largest spread of the case's measured runs over the four figures (no simulated run needed)."""
    measured = measured_dirs(case) if os.path.isdir(case) else []
    if not measured:
        return tt.NAN
    ms = [tt.read_summary(os.path.join(case, d)) for d in measured]
    s = [spread_of([tt.metric(m, k) for m in ms]) for k in KEYS]  # absent figures: nan, left out
    s = [x for x in s if not tt.is_nan(x)]
    return max(s) if s else tt.NAN


def earlier_sets(case):
    """Spreads of the sets measured before this one (tools/sim-vs-measured keeps them in set_K/)."""
    out = []
    for d in sorted(x for x in os.listdir(case) if x.startswith("set_")):
        s = max_spread(os.path.join(case, d))
        if not tt.is_nan(s):
            out.append(s)
    return out


def no_nan(x):
    """JSON has no nan: null instead."""
    if isinstance(x, dict):
        return {k: no_nan(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [no_nan(v) for v in x]
    return None if tt.is_nan(x) else x


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    if argv[0] == "--max-spread":
        if len(argv) != 2:
            print("usage: sim_error.py --max-spread CASE_DIR", file=sys.stderr)
            return 2
        s = max_spread(argv[1])
        print("nan" if tt.is_nan(s) else "%.6f" % s)
        return 0
    json_path = None
    if argv[0] == "--json":
        if len(argv) < 3:
            print("usage: sim_error.py --json FILE CASE_DIR...", file=sys.stderr)
            return 2
        json_path, argv = argv[1], argv[2:]
    rows, steps, missing, cases_out, failed, conds = [], [], [], [], [], []
    n_warned = 0
    worst = tt.NAN
    for case in argv:
        name = os.path.basename(os.path.normpath(case))
        figs = case_figures(case)
        if figs is None:
            missing.append("%s: no runs in %s" % (name, case))
            continue
        n_runs = len(measured_dirs(case, failed))
        verdicts, figures = [], {}
        for k in KEYS:
            reps, sim = figs[k]
            vals = [v for v in reps if v is not None and not tt.is_nan(v)]
            med = statistics.median(vals) if vals else tt.NAN
            spread = spread_of(vals)
            err = tt.rel_error(sim, med)
            target, verdict = judge(err, spread, k)
            if not tt.is_nan(err):
                worst = abs(err) if tt.is_nan(worst) else max(worst, abs(err))
            verdicts.append(verdict)
            if not vals and tt.is_nan(sim):
                continue  # no run holds this figure: no row
            figures[k] = {"measured": reps, "median": med, "spread": spread, "simulated": sim, "error": err,
                          "target": target, "verdict": verdict}
            rows.append([name, tt.metric_label(k, unit=False), tt.metric_unit(k), med, n_runs,
                         tt.fmt_pct(spread, sign=False), sim, tt.fmt_pct(err), tt.fmt_pct(target, sign=False),
                         verdict])
        # A figure too noisy to judge is not counted either way; a case is judged on the others,
        # and needs at least half of the figures its runs hold judged to count.
        judged = [v for v in verdicts if v in ("met", "missed")]
        held = [v for v in verdicts if v != "-"]
        if "missed" in judged:
            case_verdict = "missed"
        elif not held or len(judged) * 2 < len(held):
            case_verdict = "noisy"
        else:
            case_verdict = "met"
        taken, warned, n_cond = tt.run_conditions([os.path.join(case, d) for d in measured_dirs(case)])
        speeds = [s for s in (run_speed(os.path.join(case, d)) for d in measured_dirs(case)) if s is not None]
        speed_spread = spread_of(speeds) if len(speeds) > 1 else tt.NAN
        if n_cond:
            conds.append([name, n_cond, tt.fmt_pct(taken, sign=False), len(warned),
                          " ".join("%.3f" % s for s in speeds) if speeds else "-",
                          tt.fmt_pct(speed_spread, sign=False) if not tt.is_nan(speed_spread) else "-"])
            n_warned += len(warned)
        cases_out.append({"case": name, "runs": n_runs, "verdict": case_verdict,
                          "conditions": {"cores_taken_max": taken, "runs_warned": len(warned),
                                         "run_speeds": speeds, "run_speed_spread": speed_spread},
                          "figures_met": verdicts.count("met"), "figures_noisy": verdicts.count("noisy"),
                          "figures": figures,
                          "earlier_set_spreads": earlier_sets(case)})
        dirs = [os.path.join(case, d) for d in measured_dirs(case)]
        hosts = host_shares(dirs)
        for kind, errs in step_errors(dirs).items():
            if errs:
                a = [abs(e) for e in errs]
                steps.append([name, kind, len(errs), tt.fmt_pct(tt.percentile(a, 50, "index"), sign=False),
                              tt.fmt_pct(tt.percentile(a, 90, "index"), sign=False), tt.fmt_pct(max(a), sign=False),
                              tt.fmt_pct(statistics.median(errs)),
                              tt.fmt_pct(statistics.median(hosts[kind]), sign=False) if hosts[kind] else "-"])
    if rows:
        print(tt.format_table(["case", "metric", "unit", "measured", "runs", "spread %", "simulated", "error %",
                               "target %", "verdict"], rows, left=3,
                              title="simulated vs measured; target: |error| within max(5 %, spread) for a mean or p50, "
                                    "max(10 %, spread) for a p90 or p99; spread above 15 %: noisy, not counted"))
    if missing:
        print("\n".join(missing))
    if steps:
        print(tt.format_table(["case", "step kind", "steps", "|error| median %", "|error| p90 %", "|error| max %",
                               "signed median %", "host median %"], steps, left=2,
                              title="per-step prediction error of the measured runs (steps.csv predicted_ms against the start-to-start "
                                    "time of back-to-back steps; positive: priced high; host: the loop's own work outside "
                                    "the executor (host_ms) as a share of that time, - where not measured):"))
    if conds:
        print(tt.format_table(["case", "runs", "cores taken max %", "runs warned", "compute/price per run",
                               "its spread %"], conds,
                              title="conditions of the measured runs (summary.json): the largest share of their "
                                    "cores' time other work took; a run warns above %.0f %%. compute/price: each run's "
                                    "median over its steps of the executor's time over the profile's price (the same "
                                    "profile for every run, so its spread is the machine's own speed moving)"
                              % (100 * tt.TAKEN_WARN)))
    if n_warned:
        print("WARNING: %d measured run(s) ran while other work took their cores: their figures, and the errors "
              "against them, are a busy machine's, not this one's" % n_warned)
    for c in cases_out:
        if c["earlier_set_spreads"]:
            print("%s: measured again; the earlier set(s) had a spread of %s %%" % (
                c["case"], ", ".join(tt.fmt_pct(s, sign=False) for s in c["earlier_set_spreads"])))
    met = [c["case"] for c in cases_out if c["verdict"] == "met"]
    noisy = [c["case"] for c in cases_out if c["verdict"] == "noisy"]
    print("cases within the target (every figure judged met, at least half judged): %d of %d%s" % (
        len(met), len(cases_out), (" (%s)" % ", ".join(met)) if met else ""))
    part = ["%s (%d noisy)" % (c["case"], c["figures_noisy"]) for c in cases_out
            if c["verdict"] == "met" and c["figures_noisy"]]
    if part:
        print("  of which with noisy figures not counted: %s" % ", ".join(part))
    if noisy:
        print("noisy (more than half the figures with a spread above 15 %%, not counted): %s" % ", ".join(noisy))
    if failed:
        print("measured runs that did not finish (no summary.json, left out): %s" % ", ".join(failed))
    one_run = [c["case"] for c in cases_out if c["runs"] < 2]
    if one_run:
        print("measured once, so no spread (the target is the fixed floor): %s" % ", ".join(one_run))
    print("largest |error| of a TTFT/TPOT/ITL figure: %s%%" % tt.fmt_pct(worst, sign=False))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(no_nan({"floor": FLOOR, "noisy_above": NOISY, "cases": cases_out}), f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
