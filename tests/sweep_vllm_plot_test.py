#!/usr/bin/env python3
"""vLLM's own sweep plots read a tandem sweep (issue #34, interop).

Usage: sweep_vllm_plot_test.py SOURCE_DIR TANDEM

`tandem sweep` writes DIR/vllm/ in the layout of `vllm bench sweep serve` (sim/sweep/sweep_vllm.h).
This test takes vLLM's plotting code (vllm/benchmarks/sweep/plot.py, plot_pareto.py, utils.py and
vllm/utils/collection_utils.py) out of vLLM's wheel at test time into a scratch folder (never into
the project), with empty package files in place of vLLM's heavy ones (its vllm/__init__.py and
vllm/utils/__init__.py import torch) and minimal import_utils and argparse_utils (PlaceholderModule,
used only when pandas or seaborn are missing; the parser class of their command lines), then:
  plot       vLLM's plot() over DIR/vllm (x request_throughput, y p99_e2el_ms, a curve a point):
             a PNG, one curve a tandem point
  pareto     vLLM's plot_pareto() with --gpu-count-var num_gpus: a PNG; its records' tokens_per_gpu
             is output_throughput over the layout's GPUs (2 for 1P1D and for 2 replicas); without
             the option, tensor_parallel_size x data_parallel_size gives the replicas' 2 GPUs
  records    every run of the sweep is one record, its figures the run's (results.json)
  mutation   vLLM's plot() over a plain `tandem run --out` folder (its summary.json a dict, not
             vLLM's list) fails, as the issue found: the layout is what makes it work
  foreign    a DIR/vllm that tandem did not write is refused by collect, not removed
Runs under .venv-vllm/bin/python (tools/setup --vllm-plot: pandas, seaborn, matplotlib and the
pinned vLLM wheel in .venv-vllm/wheels/); exit 77 (skipped) when that is missing.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from sweep_helpers import Failures  # noqa: E402

FROM_WHEEL = ["vllm/benchmarks/sweep/plot.py", "vllm/benchmarks/sweep/plot_pareto.py",
              "vllm/benchmarks/sweep/utils.py", "vllm/utils/collection_utils.py"]
# Stands in for vllm/utils/import_utils.py (which imports vLLM's logger and env): the plot modules
# take only PlaceholderModule from it, for when pandas/seaborn/matplotlib are absent.
IMPORT_UTILS_STUB = '''
class PlaceholderModule:
    def __init__(self, name):
        self.name = name
    def placeholder_attr(self, attr):
        return self
    def __getattr__(self, key):
        raise ImportError("%s is not installed" % self.name)
'''

# Stands in for vllm/utils/argparse_utils.py (vLLM's logger, regex, yaml): the plot modules take
# its parser class for their command lines only, which this test does not build.
ARGPARSE_UTILS_STUB = '''
import argparse
class FlexibleArgumentParser(argparse.ArgumentParser):
    pass
'''


def vllm_modules(wheel, into):
    """vLLM's plotting modules from its wheel, importable from `into`."""
    with zipfile.ZipFile(wheel) as z:
        for name in FROM_WHEEL:
            z.extract(name, into)
    for pkg in ["vllm", "vllm/utils", "vllm/benchmarks", "vllm/benchmarks/sweep"]:
        open(os.path.join(into, pkg, "__init__.py"), "w").close()
    with open(os.path.join(into, "vllm/utils/import_utils.py"), "w") as f:
        f.write(IMPORT_UTILS_STUB)
    with open(os.path.join(into, "vllm/utils/argparse_utils.py"), "w") as f:
        f.write(ARGPARSE_UTILS_STUB)
    sys.path.insert(0, into)
    import matplotlib
    matplotlib.use("Agg")
    from vllm.benchmarks.sweep import plot, plot_pareto
    return plot, plot_pareto


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, tandem = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    venv_python = os.path.join(src, ".venv-vllm", "bin", "python")
    wheels = sorted(glob.glob(os.path.join(src, ".venv-vllm", "wheels", "vllm-*.whl")))
    if not wheels or not os.access(venv_python, os.X_OK):
        print("skipped: no .venv-vllm with vLLM's wheel (tools/setup --vllm-plot)")
        return 77
    if os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(src, ".venv-vllm")):
        return subprocess.call([venv_python] + sys.argv)
    c = Failures("vllm-plot")
    with tempfile.TemporaryDirectory(prefix="vllm-plot-") as tmp:
        keep = os.environ.get("TANDEM_VLLM_PLOT_KEEP")  # a folder to copy the figures into, to look at them
        plot, plot_pareto = vllm_modules(wheels[-1], os.path.join(tmp, "code"))
        print("vLLM's plot code from %s" % os.path.basename(wheels[-1]))
        out = os.path.join(tmp, "sweep")
        sweep = os.path.join(src, "workloads", "sweeps", "stage4_capacity.yaml")
        r = subprocess.run([tandem, "sweep", sweep, "--out", out, "--quiet"], capture_output=True, text=True)
        if not c.ok(r.returncode == 0, "tandem sweep: exit %d: %s" % (r.returncode, r.stderr[-500:])):
            return 1
        layout = os.path.join(out, "vllm")
        results = json.load(open(os.path.join(out, "results.json")))
        runs = [(p, run) for p in results["points"] if "runs" in p for run in p["runs"]]
        files = sorted(glob.glob(os.path.join(layout, "*", "summary.json")))
        records = [rec for f in files for rec in json.load(open(f))]

        # records: one a run, its figures the run's
        c.ok(len(records) == len(runs) and len(files) == len(runs),
             "records: %d records in %d files for %d runs" % (len(records), len(files), len(runs)))
        by_key = {(rec["tandem_point"], rec["request_rate"]): rec for rec in records}
        for p, run in runs:
            rec = by_key.get((p["name"], run["rate"]))
            if not c.ok(rec is not None, "records: no record of %s at rate %s" % (p["name"], run["rate"])):
                continue
            m = run["metrics"]
            c.ok(rec["p99_e2el_ms"] == m["e2e_ms.p99"] and rec["median_ttft_ms"] == m["ttft_ms.p50"] and
                 rec["output_throughput"] == m["throughput.output_tokens_per_s"] and
                 rec["completed"] == m["requests.finished"] and rec["num_gpus"] == p["layout"]["num_gpus"],
                 "records: %s at %s: figures differ from results.json" % (p["name"], run["rate"]))

        # plot: vLLM's FacetGrid, a curve a tandem point
        figs = os.path.join(tmp, "figs")
        plot.plot(output_dir=Path(layout), fig_dir=Path(figs),
                  fig_by=[], row_by=[], col_by=[], curve_by=["tandem_point"], var_x="request_throughput",
                  var_y="p99_e2el_ms", filter_by=plot.PlotFilters(), bin_by=plot.PlotBinners(), scale_x=None,
                  scale_y=None, dry_run=False)
        pngs = glob.glob(os.path.join(figs, "*.png"))
        c.ok(len(pngs) == 1 and os.path.getsize(pngs[0]) > 10000, "plot: PNGs %s" % pngs)

        # pareto: per GPU with --gpu-count-var num_gpus, and by tp x dp without it
        extra = {"label_by": ["tandem_point"]} if "label_by" in __import__("inspect").signature(
            plot_pareto.plot_pareto).parameters else {}  # vLLM 0.34 labels the frontier's points
        plot_pareto.plot_pareto(output_dir=Path(layout), user_count_var=None, gpu_count_var="num_gpus", dry_run=False,
                                **extra)
        pareto = glob.glob(os.path.join(layout, "pareto", "*.png"))
        c.ok(len(pareto) == 1 and os.path.getsize(pareto[0]) > 10000, "pareto: PNGs %s" % pareto)
        prepared, _ = plot_pareto._prepare_records(records, user_count_var=None, gpu_count_var="num_gpus")
        for rec in prepared:
            c.ok(abs(rec["tokens_per_gpu"] * rec["num_gpus"] - rec["output_throughput"]) < 1e-6 * (1 + rec["output_throughput"]),
                 "pareto: %s: tokens_per_gpu %s x %s GPUs != output_throughput %s" % (
                     rec["tandem_point"], rec["tokens_per_gpu"], rec["num_gpus"], rec["output_throughput"]))
        gpus = {rec["tandem_point"]: plot_pareto._infer_gpu_count(rec, "num_gpus") for rec in records}
        c.ok(gpus.get("1p1d") == 2 and gpus.get("2-replicas") == 2 and gpus.get("colocated") == 1,
             "pareto: GPUs by point %s, expected 1p1d 2, 2-replicas 2, colocated 1" % gpus)
        reps = {plot_pareto._infer_gpu_count(rec, None) for rec in records if rec["tandem_point"] == "2-replicas"}
        c.ok(reps == {2.0}, "pareto without --gpu-count-var: 2 replicas counted as %s GPUs (tp x dp)" % reps)
        if keep:
            import shutil
            os.makedirs(keep, exist_ok=True)
            for f in pngs + pareto:
                shutil.copy(f, keep)
        print("plot: %d records of %d points; pareto: %d points, GPUs %s" % (
            len(records), len({r["tandem_point"] for r in records}), len(prepared), gpus))

        # mutation: tandem's own run folder is not vLLM's layout (its summary.json a dict)
        run_dir = os.path.join(tmp, "run")
        subprocess.run([tandem, "run", os.path.join(src, "workloads", "quickstart.yaml"), "--set", "requests.count=20",
                        "--out", run_dir, "--quiet", "--trace", "none"], check=True)
        try:
            plot.plot(output_dir=Path(run_dir), fig_dir=Path(os.path.join(tmp, "figs2")), fig_by=[], row_by=[],
                      col_by=[], curve_by=[], var_x="request_throughput", var_y="p99_e2el_ms",
                      filter_by=plot.PlotFilters(), bin_by=plot.PlotBinners(), scale_x=None, scale_y=None,
                      dry_run=False)
            c.ok(False, "mutation: vLLM's plot read a plain tandem run folder; the check above cannot fail")
        except Exception as e:
            print("mutation: vLLM's plot over a tandem run folder fails: %s: %s" % (type(e).__name__, str(e)[:80]))
            c.passed += 1

        # foreign: a vllm/ folder without tandem's marker is refused, not removed
        foreign = os.path.join(tmp, "foreign")
        os.makedirs(os.path.join(foreign, "vllm"))
        open(os.path.join(foreign, "vllm", "mine.txt"), "w").close()
        r = subprocess.run([tandem, "sweep", sweep, "--out", foreign, "--quiet"], capture_output=True, text=True)
        c.ok(r.returncode != 0 and "was not written by tandem sweep" in r.stderr and
             os.path.exists(os.path.join(foreign, "vllm", "mine.txt")),
             "foreign: exit %d, stderr %s" % (r.returncode, r.stderr[-300:]))
    return c.end()


if __name__ == "__main__":
    sys.exit(main())
