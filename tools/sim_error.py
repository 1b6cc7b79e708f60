#!/usr/bin/env python3
"""Simulated vs measured: the error table of tools/sim-vs-measured and tools/device-calibrate.

  tools/sim_error.py CASE_DIR...        each CASE_DIR holds measured_1..N/ and simulated/ run folders

For each case: TTFT and TPOT (mean, p99) measured (median of the repetitions, with their spread
(max - min) / median) and simulated, and the simulation's error against the measured median.
Then, over every measured repetition, the per-step prediction error (steps.csv: predicted_ms,
the cost model's price of the step, against elapsed_ms) by kind: decode-only, prefill-only,
mixed; median, p90 and max of |error|, and the median signed error.
Standard library only (tools/tandem_tools.py).
"""
import csv
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import tandem_tools as tt  # noqa: E402

KEYS = ["ttft_mean", "ttft_p99", "tpot_mean", "tpot_p99"]


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
    configs, steps, missing = [], [], []
    for case in argv:
        name = os.path.basename(os.path.normpath(case))
        if not os.path.isdir(case):
            continue
        measured = sorted(d for d in os.listdir(case) if d.startswith("measured_"))
        if not measured or not os.path.isdir(os.path.join(case, "simulated")):
            missing.append("%s: no runs in %s" % (name, case))
            continue
        ms = [tt.read_summary(os.path.join(case, d)) for d in measured]
        sim = tt.read_summary(os.path.join(case, "simulated"))
        configs.append((name, {k: [tt.metric(m, k) for m in ms] for k in KEYS}, tt.summary_metrics(sim, KEYS)))
        for kind, errs in step_errors([os.path.join(case, d) for d in measured]).items():
            if errs:
                a = [abs(e) for e in errs]
                steps.append([name, kind, len(errs), tt.fmt_pct(tt.percentile(a, 50, "index"), sign=False),
                              tt.fmt_pct(tt.percentile(a, 90, "index"), sign=False), tt.fmt_pct(max(a), sign=False),
                              tt.fmt_pct(statistics.median(errs))])
    worst = tt.NAN
    if configs:
        text, worst = tt.error_table(configs, KEYS, config_header="case")
        print(text)
    if missing:
        print("\n".join(missing))
    if steps:
        print(tt.format_table(["case", "step kind", "steps", "|error| median %", "|error| p90 %", "|error| max %",
                               "signed median %"], steps, left=2,
                              title="per-step prediction error of the measured runs (steps.csv pred_error):"))
    print("largest |error| of a TTFT/TPOT figure: %s%%" % tt.fmt_pct(worst, sign=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
