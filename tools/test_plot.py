"""tools/plot's sweep figures, on results made up here: python3 tools/test_plot.py

  legend    sweep_latency.png with 12 points (sweep_latency_figure): no legend lies over either axes (a
            legend inside an axes hid the curves under it)
  pareto    sweep_pareto.png: a run that missed the SLO is drawn as an x, never as a met run, and
            never joins the Pareto front; in a rates sweep (no verdicts) every run is on it as before
  capacity  capacity.png (horizontal bars): a cannot_finish point has no bar and says "cannot
            finish" with its finished share; a found point's bar carries its finished share
Needs matplotlib (tools/plot re-runs itself under /usr/bin/python3 for it; this test does the
same, and is skipped (exit 77) without it).
"""
import importlib.machinery
import importlib.util
import os
import sys
import unittest

HERE = os.path.dirname(os.path.realpath(__file__))
try:
    import matplotlib  # noqa: F401
except ImportError:
    if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    print("SKIPPED: no matplotlib")
    sys.exit(77)

loader = importlib.machinery.SourceFileLoader("tandem_plot", os.path.join(HERE, "plot"))
spec = importlib.util.spec_from_loader("tandem_plot", loader)
plot = importlib.util.module_from_spec(spec)
loader.exec_module(plot)


def run(rate, ttft, tpot, tok_s, meets=None, finished=100, total=100):
    r = {"rate": rate, "metrics": {"ttft_ms.p99": ttft, "tpot_ms.p99": tpot, "throughput.output_tokens_per_s": tok_s,
                                   "requests.finished": finished, "requests.total": total}}
    if meets is not None:
        r["meets_slo"] = meets
    return r


def point(name, runs, capacity=None):
    p = {"name": name, "runs": runs}
    if capacity:
        p["capacity"] = capacity
    return p


class Figures(unittest.TestCase):
    def test_legend_hides_no_curve(self):
        points = [point("configuration number %d" % i, [run(r, 100 * r * (i + 1), 5 + r, 100 * r) for r in (1, 2, 4, 8)])
                  for i in range(12)]
        fig = plot.sweep_latency_figure(points, "requests.arrival.rate", {"ttft_p99_ms": 1000}, "t")
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
        self.assertTrue(legends, "no legend")
        self.assertEqual(sum(len(l.get_texts()) for l in legends), 12, "a point missing from the legend")
        for leg in legends:
            box = leg.get_window_extent(r)
            for ax in fig.axes:
                self.assertFalse(box.overlaps(ax.get_window_extent(r)), "the legend lies over an axes")
        plot.plt.close(fig)

    def test_pareto_marks_misses(self):
        points = [point("a", [run(1, 10, 5, 100, True), run(2, 20, 6, 300, True), run(4, 90, 40, 900, False)]),
                  point("b", [run(1, 10, 4, 120, True), run(8, 99, 80, 2000, False)])]
        fig, front, missed = plot.pareto_figure(points, {"tpot_p99_ms": 10})
        self.assertEqual(sorted(missed), [(40, 900), (80, 2000)])
        self.assertNotIn((40, 900), front)
        self.assertNotIn((80, 2000), front)
        self.assertEqual(front, [(4, 120), (6, 300)])
        ax = fig.axes[0]
        # The misses are their own collections (marker x), apart from the met runs' dots.
        met_offsets = [tuple(o) for c in ax.collections[:] if c.get_label() in ("a", "b") for o in c.get_offsets()]
        self.assertNotIn((40.0, 900.0), met_offsets)
        self.assertNotIn((80.0, 2000.0), met_offsets)
        labels = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
        self.assertIn("x: missed the SLO", labels)
        plot.plt.close(fig)
        # A rates sweep has no verdicts: every run may be on the front.
        rates = [point("a", [run(1, 10, 5, 100), run(2, 20, 6, 300), run(4, 90, 40, 900)])]
        fig, front, missed = plot.pareto_figure(rates, {})
        self.assertEqual(missed, [])
        self.assertEqual(front, [(5, 100), (6, 300), (40, 900)])
        plot.plt.close(fig)

    def test_capacity_cannot_finish_has_no_bar(self):
        caps = [point("ok", [run(1, 10, 5, 100, True), run(9, 10, 5, 100, True), run(10, 10, 5, 100, False)],
                      {"status": "found", "rate": 9, "first_missed": 10, "runs": 3}),
                point("never", [run(1, 10, 5, 100, False, finished=97, total=500)],
                      {"status": "cannot_finish", "rate": 0, "first_missed": 1, "runs": 2})]
        fig = plot.capacity_figure(caps, "requests.arrival.rate", {"ttft_p99_ms": 1000}, 1)
        ax = fig.axes[0]
        # Horizontal bars (the names in full on the left): a bar's length is its width.
        widths = [b.get_width() for b in ax.patches]
        self.assertEqual(widths, [9, 0])
        self.assertEqual([t.get_text() for t in ax.get_yticklabels()], ["ok", "never"])
        texts = [t.get_text() for t in ax.texts]
        self.assertIn("9, 100/100 finished", texts)
        self.assertIn("cannot finish, 97/500 finished", texts)
        plot.plt.close(fig)

    def test_cost_pareto_marks_misses(self):
        def capped(name, index, runs):
            p = point(name, runs, {"status": "found", "rate": 2, "first_missed": 4, "runs": len(runs)})
            p["index"] = index
            return p
        slo = {"ttft_p99_ms": 100, "tpot_p99_ms": 10}
        caps = [capped("a", 0, [run(1, 50, 5, 100, True), run(2, 90, 8, 200, True), run(4, 300, 20, 400, False)]),
                capped("b", 1, [run(1, 20, 2, 100, True), run(4, 50, 12, 400, False)])]
        self.assertEqual(plot.slo_share(caps[0]["runs"][1]["metrics"], slo), 0.9)  # the worse of 90/100, 8/10
        costs = {0: {"gpus": 1, "usd": 3.6}, 1: {"gpus": 2, "usd": 7.2}}
        fig, front, missed, xlabel = plot.cost_pareto_figure(caps, slo, costs)
        self.assertIn("requests per", xlabel)
        # a: 1000, 2000, 4000 requests per $ (rate x 3600 / 3.6); b: 500 and 2000 (its $ per hour doubled).
        self.assertEqual(sorted(missed), [(2000.0, 1.2), (4000.0, 3.0)])  # b's rate 4: tpot 12/10; a's: ttft 300/100
        self.assertEqual(front, [(500.0, 0.2), (1000.0, 0.5), (2000.0, 0.9)])  # none both cheaper and further inside
        for x, y in front:
            self.assertLessEqual(y, 1.0)
        plot.plt.close(fig)
        # Without prices: per GPU.
        fig, front, missed, xlabel = plot.cost_pareto_figure(caps, slo, {0: {"gpus": 1}, 1: {"gpus": 2}})
        self.assertIn("per GPU", xlabel)
        self.assertEqual(sorted(missed), [(2.0, 1.2), (4.0, 3.0)])
        plot.plt.close(fig)


if __name__ == "__main__":
    unittest.main()
