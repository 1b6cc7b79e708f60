#!/usr/bin/env python3
"""Simulated vs measured: the error table of tools/sim-vs-measured and tools/device-calibrate.

  tools/sim_error.py CASE_DIR...        each CASE_DIR holds measured_1..N/ and simulated/ run folders

For each case: TTFT and TPOT (mean, p99) measured (median of the repetitions, with their spread
(max - min) / median) and simulated, and the simulation's error against the measured median.
Then, over every measured repetition, the per-step prediction error (steps.csv: predicted_ms,
the cost model's price of the step, against elapsed_ms) by kind: decode-only, prefill-only,
mixed; median, p90 and max of |error|, and the median signed error. Standard library only.
"""
import csv
import json
import os
import statistics
import sys


def load(path):
    with open(os.path.join(path, "summary.json")) as f:
        return json.load(f)


def pct(sorted_vals, q):
    return sorted_vals[min(len(sorted_vals) - 1, int(q * len(sorted_vals)))] if sorted_vals else float("nan")


def step_errors(run_dirs):
    kinds = {"decode": [], "prefill": [], "mixed": []}
    for d in run_dirs:
        path = os.path.join(d, "steps.csv")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for row in csv.DictReader(f):
                if "pred_error" not in row:
                    continue
                n_pre, n_dec = int(row["n_prefill"]), int(row["n_decode"])
                kind = "decode" if n_pre == 0 else ("prefill" if n_dec == 0 else "mixed")
                kinds[kind].append(float(row["pred_error"]))
    return kinds


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    worst = 0.0
    print(f"{'case':34} {'metric':10} {'measured':>10} {'spread':>7} {'simulated':>10} {'error':>8}")
    for case in argv:
        name = os.path.basename(os.path.normpath(case))
        if not os.path.isdir(case):
            continue
        measured = sorted(d for d in os.listdir(case) if d.startswith("measured_"))
        if not measured or not os.path.isdir(os.path.join(case, "simulated")):
            print(f"{name:34} (no runs: {case})")
            continue
        ms = [load(os.path.join(case, d)) for d in measured]
        sim = load(os.path.join(case, "simulated"))
        for metric in ("ttft_ms", "tpot_ms"):
            for q in ("mean", "p99"):
                vals = [m[metric][q] for m in ms]
                med = statistics.median(vals)
                spread = (max(vals) - min(vals)) / med if med else float("nan")
                err = (sim[metric][q] - med) / med if med else float("nan")
                worst = max(worst, abs(err))
                print(f"{name:34} {metric[:4] + ' ' + q:10} {med:>10.2f} {100 * spread:>6.1f}% "
                      f"{sim[metric][q]:>10.2f} {100 * err:>+7.1f}%")
        kinds = step_errors([os.path.join(case, d) for d in measured])
        for kind, errs in kinds.items():
            if not errs:
                continue
            a = sorted(abs(e) for e in errs)
            print(f"{'':34} steps {kind:8} n={len(errs):<6} |err| median {100 * pct(a, 0.5):5.1f}% "
                  f"p90 {100 * pct(a, 0.9):5.1f}% max {100 * a[-1]:6.1f}%; signed median "
                  f"{100 * statistics.median(errs):+5.1f}%")
    print(f"largest |error| of a TTFT/TPOT figure: {100 * worst:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
