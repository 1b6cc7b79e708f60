#!/usr/bin/env python3
"""tools/plot's figures, read back from matplotlib (issue #35, 4): what a reader could not read.

Usage: plot_test.py SOURCE_DIR TANDEM

  timeline   a 1P1D run's instances are labelled prefill and decode, a data-parallel run's
             replica 0 and 1, each line its own colour; every line is drawn as steps (no
             diagonals across idle gaps); the time axis says simulated, wall-clock or measured
             back to back, from summary.json's clock
  latency    the ITL and TPOT tail panels are log-log (1 - CDF), and the run with the smaller
             ITL p99 lies a decade left of the other there
  pd         a 1P1D run gives a per-request timeline of at most 40 requests with every phase
             drawn; a colocated run none
  sweep      a grid with long point names: capacity.png's names and title lie inside the image,
             sweep_latency.png is titled with the sweep file, its SLO lines are labelled, its
             legend lies below the panels (not over a curve), its log axes label more than one tick

Standard library and matplotlib; exit 77 (skipped) without matplotlib.
"""
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

try:
    import matplotlib
    matplotlib.use("Agg")
except ImportError:
    # As tools/plot: a python3 earlier on PATH (pyenv, a venv) may lack Debian's matplotlib.
    if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    print("plot_test: matplotlib missing: skipped")
    sys.exit(77)


class Failures:
    def __init__(self):
        self.passed = self.failed = 0

    def ok(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print("FAIL " + what)
        return cond


def load_plot(src):
    loader = importlib.machinery.SourceFileLoader("tandem_plot", os.path.join(src, "tools", "plot"))
    spec = importlib.util.spec_from_loader("tandem_plot", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def tandem(exe, *args):
    r = subprocess.run([exe] + list(args), capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        sys.exit("plot_test: tandem %s failed (exit %d): %s" % (" ".join(args), r.returncode, r.stderr))
    return r


def inside(fig, artist):
    """The artist's drawn box lies within the figure's (a few pixels of slack)."""
    fig.canvas.draw()
    box = artist.get_window_extent(fig.canvas.get_renderer())
    w, h = fig.canvas.get_width_height()
    return box.x0 >= -2 and box.y0 >= -2 and box.x1 <= w + 2 and box.y1 <= h + 2


def test_runs(f, plot, exe, src, tmp):
    st4 = os.path.join(src, "workloads", "stage4_pd.yaml")
    few = ["--set", "requests.count=120", "--quiet"]
    dirs = {}
    for name, sets in (("colo", []), ("dp2", ["--set", "engine.data_parallel=2"]),
                       ("pd", ["--set", "disaggregation.enabled=true"])):
        dirs[name] = os.path.join(tmp, name)
        tandem(exe, "run", st4, *few, *sets, "--out", dirs[name], "--trace", "requests")
    runs = {k: plot.load_run(d) for k, d in dirs.items()}

    fig = plot.timeline_figure([runs["pd"], runs["dp2"]], ["1P1D", "dp2"], "t")
    lines = fig.axes[0].get_lines()
    labels = [l.get_label() for l in lines]
    f.ok(labels == ["1P1D prefill (#0)", "1P1D decode (#1)", "dp2 replica 0", "dp2 replica 1"],
         "timeline: instance labels %s" % labels)
    f.ok(len({l.get_color() for l in lines}) == len(lines), "timeline: instances share a colour")
    f.ok(all(l.get_drawstyle() == "steps-post" for ax in fig.axes for l in ax.get_lines()),
         "timeline: a line is not drawn as steps")
    f.ok(fig.axes[-1].get_xlabel() == "simulated time (s)", "timeline: x label %r" % fig.axes[-1].get_xlabel())
    one = plot.timeline_figure([runs["colo"]], ["colocated"], "t")
    f.ok([l.get_label() for l in one.axes[0].get_lines()] == ["colocated"], "timeline: one instance is named by run only")

    # A measured run: the axis says what its times are.
    cpu = os.path.join(tmp, "cpu")
    tandem(exe, "run", os.path.join(src, "workloads", "cpu_tiny.yaml"), "--backend", "cpu", "--threads", "1",
           "--set", "requests.count=4", "--out", cpu, "--quiet", "--trace", "none")
    xl = plot.timeline_figure([plot.load_run(cpu)], ["cpu"], "t").axes[-1].get_xlabel()
    f.ok(xl == "wall-clock time from the run's start (s)", "timeline: a wall-clock run's x label %r" % xl)

    fig = plot.latency_figure([runs["colo"], runs["pd"]], ["colocated", "1P1D"], "t")
    itl_tail, tpot_tail = fig.axes[4], fig.axes[5]
    f.ok(itl_tail.get_xscale() == "log" and itl_tail.get_yscale() == "log", "latency: the ITL tail panel is not log-log")
    f.ok(tpot_tail.get_yscale() == "log", "latency: the TPOT tail panel's share axis is not log")
    p99 = {k: runs[k]["summary"]["itl_ms"]["p99"] for k in ("colo", "pd")}
    # Where each run's tail crosses 1 %: its p99, read off the panel's own data.
    cross = []
    for line in itl_tail.get_lines()[:2]:
        xs, ys = line.get_xdata(), line.get_ydata()
        cross.append(min((x for x, y in zip(xs, ys) if y <= 0.01), default=float("nan")))
    f.ok(cross[0] > 5 * cross[1], "latency: ITL tails cross 1 %% at %s (p99 %s): not a decade apart" % (cross, p99))
    print("latency: ITL p99 colocated %.1f ms, 1P1D %.1f ms; the tail panel crosses 1 %% at %.1f and %.1f ms"
          % (p99["colo"], p99["pd"], cross[0], cross[1]))

    fig = plot.pd_requests_figure(runs["pd"], "1P1D")
    if f.ok(fig is not None, "pd: no per-request figure for a 1P1D run"):
        ax = fig.axes[0]
        n = len(ax.get_yticklabels())
        colours = {tuple(round(c, 3) for c in p.get_facecolor()) for p in ax.patches}
        f.ok(0 < n <= 40, "pd: %d request rows" % n)
        # At this load a transfer starts as soon as P samples (no parking): queued, prefill,
        # transfer and decode at least; the legend names all five phases.
        f.ok(len(colours) >= 4, "pd: %d phase colours drawn (queued, prefill, transfer, decode)" % len(colours))
        legend = [t.get_text() for t in fig.legends[0].get_texts()] if fig.legends else []
        f.ok({"queued", "prefill", "parked", "transfer", "decode", "first decode token (on D)"} <= set(legend),
             "pd: legend %s" % legend)
        f.ok(any(l.get_marker() == "o" for l in ax.get_lines()), "pd: no first decode token marked")
        f.ok(fig.legends and inside(fig, fig.legends[0]), "pd: the legend lies outside the image")
        f.ok(fig.axes[1].get_xscale() == "log", "pd: the since-arrival panel is not on a log axis")
    f.ok(plot.pd_requests_figure(runs["colo"], "colocated") is None, "pd: a colocated run gave a per-request figure")


def test_sweep(f, plot, exe, src, tmp):
    sweep = os.path.join(tmp, "long_names_sweep.yaml")
    with open(sweep, "w") as out:
        out.write("workload: %s\n" % os.path.join(src, "workloads", "stage4_pd.yaml"))
        out.write("configs:\n"
                  "  - name: colocated-with-a-rather-long-descriptive-name\n"
                  "  - name: two-colocated-replicas-on-two-gpus-round-robin\n"
                  "    set: {engine.data_parallel: 2}\n"
                  "  - name: one-prefill-and-one-decode-instance-1p1d\n"
                  "    set: {disaggregation.enabled: true}\n"
                  "set: {requests.count: 300}\n"
                  "capacity:\n  slo: {ttft_p99_ms: 1000, tpot_p99_ms: 10}\n  lo: 1\n  hi: 20\n  tolerance: 0.1\n")
    d = os.path.join(tmp, "sweep-out")
    r = subprocess.run([exe, "sweep", sweep, "--out", d, "--quiet", "--force"], capture_output=True, text=True,
                       timeout=600)
    if not f.ok(r.returncode == 0, "sweep: tandem sweep failed: %s" % r.stderr[-400:]):
        return
    figs = dict(plot.sweep_figures(d))
    cap = figs["capacity.png"]
    ax = cap.axes[0]
    names = [t.get_text() for t in ax.get_yticklabels()]
    f.ok(names[0].startswith("colocated-with") and len(names) == 3, "sweep: capacity names %s" % names)
    f.ok(all(inside(cap, t) for t in ax.get_yticklabels()), "sweep: a capacity point name runs off the image")
    f.ok(inside(cap, ax.title), "sweep: capacity's title is cut")
    lat = figs["sweep_latency.png"]
    f.ok("long_names_sweep.yaml" in lat._suptitle.get_text(), "sweep: latency title %r" % lat._suptitle.get_text())
    f.ok(all(any("SLO" in t.get_text() for t in a.texts) for a in lat.axes), "sweep: an SLO line is unlabelled")
    f.ok(lat.legends and inside(lat, lat.legends[0]), "sweep: no figure legend inside the image")
    lat.canvas.draw()
    rend = lat.canvas.get_renderer()
    legend_top = lat.legends[0].get_window_extent(rend).y1
    f.ok(all(legend_top <= a.get_window_extent(rend).y0 + 2 for a in lat.axes), "sweep: the legend overlaps a panel")
    for a in lat.axes:
        shown = [t.get_text() for t in a.get_yticklabels(which="both") if t.get_text()
                 and a.get_ylim()[0] <= t.get_position()[1] <= a.get_ylim()[1]]
        f.ok(len(shown) >= 2, "sweep: %s shows %d labelled tick(s): %s" % (a.get_ylabel(), len(shown), shown))
    for name, fig in figs.items():
        fig.savefig(os.path.join(d, name), dpi=110)
    print("sweep: figures of a 3-point grid with long names written to %s" % d)


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, exe = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    plot = load_plot(src)
    f = Failures()
    keep = os.environ.get("PLOT_TEST_KEEP")  # a folder to keep the runs and PNGs in, to look at them
    with tempfile.TemporaryDirectory() as tmp:
        tmp = keep or tmp
        os.makedirs(tmp, exist_ok=True)
        test_runs(f, plot, exe, src, tmp)
        test_sweep(f, plot, exe, src, tmp)
    print("%d passed, %d failed" % (f.passed, f.failed))
    return 1 if f.failed else 0


if __name__ == "__main__":
    sys.exit(main())
