"""Unit tests of tools/tandem_tools.py: python3 -m unittest tools/test_tandem_tools.py

The last class runs build/tandem (a few requests of workloads/quickstart.yaml into a temporary
folder) and is skipped when the binary is missing.
"""
import contextlib
import glob
import io
import json
import math
import os
import re
import shutil
import sys
import tarfile
import tempfile
import unittest

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import tandem_tools as tt  # noqa: E402

TANDEM = os.environ.get("TANDEM", os.path.join(ROOT, "build", "tandem"))  # meson passes its build's


class Percentiles(unittest.TestCase):
    def test_nearest_rank(self):
        v = list(range(10, 0, -1))  # 10..1, unsorted on purpose
        self.assertEqual(tt.percentile(v, 50), 5)     # ceil(0.5 * 10) = 5th smallest
        self.assertEqual(tt.percentile(v, 90), 9)
        self.assertEqual(tt.percentile(v, 99), 10)
        self.assertEqual(tt.percentile(v, 100), 10)
        self.assertEqual(tt.percentile(v, 1), 1)
        self.assertEqual(tt.percentile([7.5], 99), 7.5)

    def test_index_method(self):
        v = list(range(1, 11))
        self.assertEqual(tt.percentile(v, 50, "index"), 6)   # v[floor(0.5 * 10)]
        self.assertEqual(tt.percentile(v, 90, "index"), 10)
        self.assertEqual(tt.percentile(v, 100, "index"), 10)

    def test_empty_and_mean(self):
        self.assertTrue(math.isnan(tt.percentile([], 50)))
        self.assertTrue(math.isnan(tt.mean([])))
        self.assertEqual(tt.mean([1, 2, 3, 6]), 3)
        with self.assertRaises(ValueError):
            tt.percentile([1], 50, "linear")


class Tables(unittest.TestCase):
    def test_fmt_num(self):
        self.assertEqual(tt.fmt_num(12345.6), "12346")
        self.assertEqual(tt.fmt_num(1.23456), "1.235")
        self.assertEqual(tt.fmt_num(0.0123456), "0.01235")
        self.assertEqual(tt.fmt_num(7), "7")
        self.assertEqual(tt.fmt_num(0.0), "0")
        self.assertEqual(tt.fmt_num(float("nan")), "-")
        self.assertEqual(tt.fmt_num(None), "-")

    def test_alignment(self):
        text = tt.format_table(["config", "TTFT p99 (ms)", "req/s"],
                               [["a", 1.5, 100], ["a much longer label", 12345.6, 2], ["b", float("nan"), "n/a"]],
                               title="title line")
        lines = text.splitlines()
        self.assertEqual(lines[0], "title line")
        header, rows = lines[1], lines[2:]
        self.assertEqual(len(rows), 3)
        self.assertTrue(header.startswith("config "))
        # every line is as wide as the others: the last column is right-aligned
        self.assertEqual(len({len(l) for l in lines[1:]}), 1)
        # numbers end where their header ends (right-aligned), labels start at 0 (left-aligned)
        end = header.index("TTFT p99 (ms)") + len("TTFT p99 (ms)")
        for row, cell in zip(rows, ("1.500", "12346", "-")):
            self.assertEqual(row[end - len(cell):end], cell)
            self.assertEqual(row[end:end + 1], " ")
        for row, label in zip(rows, ("a", "a much longer label", "b")):
            self.assertTrue(row.startswith(label + " "))
        for row, cell in zip(rows, ("100", "2", "n/a")):
            self.assertTrue(row.endswith(" " + cell))

    def test_metric_labels(self):
        self.assertEqual(tt.metric_label("ttft_p99"), "TTFT p99 (ms)")
        self.assertEqual(tt.metric_label("req_per_s"), "throughput (req/s)")
        self.assertEqual(tt.metric_label("steps"), "steps")
        self.assertEqual(tt.metric_label("no_such_key"), "no_such_key")
        summary = {"ttft_ms": {"p99": 12.5}, "prefix_cache": {"hit_rate": 0.5}}
        self.assertEqual(tt.metric(summary, "ttft_p99"), 12.5)
        self.assertEqual(tt.metric(summary, "evictions"), 0)       # absent: its default
        self.assertTrue(math.isnan(tt.metric(summary, "tpot_p99")))
        self.assertTrue(math.isnan(tt.metric(summary, "ttft_long_mean")))  # computed by a tool, not in a summary

    def test_error_table(self):
        text, worst = tt.error_table([("on", {"ttft_mean": 100.0, "hit_rate": 0.0}, {"ttft_mean": 110.0, "hit_rate": 0.1}),
                                      ("off", {"ttft_mean": 50.0, "hit_rate": 0.0}, {"ttft_mean": 40.0, "hit_rate": 0.0})],
                                     ["ttft_mean", "hit_rate"])
        lines = text.splitlines()
        self.assertEqual(lines[0].split(), ["config", "metric", "unit", "measured", "simulated", "error", "%"])
        self.assertTrue(lines[1].endswith("+10.0"))
        self.assertTrue(lines[2].endswith("-"))          # measured 0: no relative error
        self.assertTrue(lines[3].endswith("-20.0"))
        self.assertAlmostEqual(worst, 0.2)
        self.assertEqual(len({len(l) for l in lines}), 1)

    def test_error_table_repetitions(self):
        text, worst = tt.error_table([("case", {"tpot_p99": [90.0, 110.0, 100.0]}, {"tpot_p99": 95.0})], ["tpot_p99"])
        header, row = text.splitlines()
        self.assertIn("spread %", header)
        self.assertEqual(row.split()[-4:], ["100.0", "20.0", "95.00", "-5.0"])
        self.assertAlmostEqual(worst, 0.05)

    def test_ratio_table(self):
        text = tt.ratio_table({"off": {"ttft_mean": 10.0, "hit_rate": 0.0}, "on": {"ttft_mean": 2.5, "hit_rate": 0.8}},
                              ["ttft_mean", "hit_rate"], "off")
        lines = text.splitlines()
        self.assertEqual(lines[0], "ratios vs off (x):")
        self.assertEqual(lines[1].split(), ["metric", "on", "(x)"])
        self.assertTrue(lines[2].endswith("0.250"))
        self.assertTrue(lines[3].endswith("-"))


class Capacity(unittest.TestCase):
    def test_capacity(self):
        self.assertEqual(tt.capacity([(8, True), (16, True), (32, False), (64, False)]), (16, 32, []))
        self.assertEqual(tt.capacity([(8, True), (16, True)]), (16, None, []))
        self.assertEqual(tt.capacity([(16, False), (8, False)]), (None, 8, []))
        self.assertEqual(tt.capacity([(8, False), (16, True), (32, False)]), (16, 32, [8]))
        self.assertIn("between 16 and 32 req/s", tt.capacity_text([(8, True), (16, True), (32, False)]))
        self.assertIn("at least 16 req/s", tt.capacity_text([(8, True), (16, True)]))
        self.assertIn("none", tt.capacity_text([(8, False)]))
        self.assertIn("not monotonic", tt.capacity_text([(8, False), (16, True), (32, False)]))

    def test_sweep_on_synthetic_runs(self):
        class FakeRunner:  # TTFT p99 grows with the rate, faster without caching
            def __init__(self):
                self.calls = []

            def run(self, label, sets, what=None):
                self.calls.append((label, list(sets)))
                rate = float(sets[-1].split("=")[1])
                slope = 10.0 if "caching=false" in sets[0] else 2.0
                return {"summary": {"ttft_ms": {"p99": slope * rate * rate}, "tpot_ms": {"p99": 20.0},
                                    "throughput": {"requests_per_s": rate}}}

        runner, out = FakeRunner(), io.StringIO()
        with contextlib.redirect_stdout(out):
            best = tt.capacity_sweep(runner, [("off", ["caching=false"]), ("on", ["caching=true"])], [4, 8, 16, 32],
                                     [("ttft_p99", 1000.0), ("tpot_p99", 50.0)], ["ttft_p99", "req_per_s"])
        # off: 10 r^2 <= 1000 up to r = 8 (16 gives 2560); on: 2 r^2 <= 1000 up to r = 16 (32 gives 2048)
        self.assertEqual(best, {"off": 8, "on": 16})
        self.assertEqual(runner.calls[0], ("off@4", ["caching=false", "requests.arrival.rate=4"]))
        text = out.getvalue()
        self.assertIn("between 8 and 16 req/s", text)
        self.assertIn("between 16 and 32 req/s", text)
        self.assertIn("TTFT p99 <= 1000 ms and TPOT p99 <= 50 ms", text)
        table = text.splitlines()[:9]
        self.assertEqual(len({len(l) for l in table}), 1)


class PlotData(unittest.TestCase):
    def test_hist_cdf(self):
        xs, ys = tt.hist_cdf([[0, 1, 1], [1, 2, 0], [2, 4, 3]])
        self.assertEqual(xs, [1, 2, 4])
        self.assertEqual(ys, [0.25, 0.25, 1.0])
        self.assertEqual(tt.hist_cdf([]), ([], []))
        self.assertEqual(tt.hist_cdf([[0, 1, 0]]), ([], []))

    def test_same_data(self):
        a, b = [[0, 1, 5], [1, 2, 1]], [[0, 1, 4], [1, 2, 2]]
        same = tt.same_data([("stage1", a), ("chunk=512", b), ("chunk=8192", [list(r) for r in a])])
        self.assertEqual(same, {"stage1": ["chunk=8192"], "chunk=512": [], "chunk=8192": ["stage1"]})

    def test_windows(self):
        # (start_s, elapsed_ms, prefill, decode): decodes every 10 ms, a 100 ms prefill step at 5.0 s
        steps = [(4 + i / 100.0, 10.0, 0, 8) for i in range(100)] + [(5.0, 100.0, 6000, 8)]
        steps += [(5.1 + i / 100.0, 10.0, 0, 8) for i in range(190)]
        self.assertEqual(len(tt.steps_between(steps, 4.995, 5.0)), 2)  # the one running into lo counts
        self.assertEqual(tt.fit_window(4, 6, steps), (4, 6, False))
        lo, hi, moved = tt.fit_window(60, 70, steps)  # past the end (7.0 s): as long, ending there
        self.assertTrue(moved)
        self.assertAlmostEqual(lo, 0.0)
        self.assertAlmostEqual(hi, 7.0)
        lo, hi, _ = tt.fit_window(60, 62, steps)
        self.assertAlmostEqual(lo, 5.0)
        self.assertAlmostEqual(hi, 7.0)
        z0, z1 = tt.zoom_window(steps, 4, 7, min_span=0.3)  # 4 x the 100 ms stall, which starts 1/4 in
        self.assertAlmostEqual(z1 - z0, 0.4)
        self.assertAlmostEqual(z0, 4.9)
        z0, z1 = tt.zoom_window(steps, 4, 7, min_span=1.0)
        self.assertAlmostEqual((z0, z1), (4.75, 5.75))
        self.assertEqual(tt.zoom_window(steps, 4.0, 4.2), (4.0, 4.2))  # shorter than min_span: itself
        self.assertEqual(tt.zoom_window(steps, 5.0, 7.0, min_span=3.0), (5.0, 7.0))
        z0, z1 = tt.zoom_window(steps, 4.92, 7, min_span=0.3)  # kept inside the window
        self.assertAlmostEqual(z0, 4.92)


class SimError(unittest.TestCase):
    """tools/sim_error.py: the error judged against the measured runs' own spread."""

    def setUp(self):
        import sim_error
        self.se = sim_error
        self.tmp = tempfile.mkdtemp(prefix="tandem-sim-error-test-")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def run_dir(self, path, ttft_mean, ttft_p99, tpot_mean, tpot_p99):
        os.makedirs(path)
        with open(os.path.join(path, "summary.json"), "w") as f:
            json.dump({"ttft_ms": {"mean": ttft_mean, "p99": ttft_p99}, "tpot_ms": {"mean": tpot_mean, "p99": tpot_p99}}, f)

    def case(self, name, measured, simulated):
        d = os.path.join(self.tmp, name)
        for i, m in enumerate(measured, 1):
            self.run_dir(os.path.join(d, "measured_%d" % i), *m)
        self.run_dir(os.path.join(d, "simulated"), *simulated)
        return d

    def test_judge(self):
        j = self.se.judge
        self.assertEqual(j(0.04, 0.02, "ttft_mean"), (0.05, "met"))       # within the 5 % floor
        self.assertEqual(j(-0.07, 0.08, "ttft_mean"), (0.08, "met"))      # within the measured spread
        self.assertEqual(j(0.07, 0.03, "tpot_mean"), (0.05, "missed"))
        self.assertEqual(j(-0.09, 0.02, "tpot_p99"), (0.10, "met"))       # p99: a 10 % floor
        self.assertEqual(j(0.12, 0.11, "tpot_p99"), (0.11, "missed"))
        self.assertEqual(j(0.01, 0.20, "ttft_mean")[1], "noisy")          # above 15 %: not counted
        self.assertEqual(j(0.04, tt.NAN, "ttft_mean"), (0.05, "met"))     # one run: the floor
        self.assertEqual(j(tt.NAN, 0.02, "ttft_mean")[1], "-")
        self.assertEqual(j(0.06, 0.02, "itl_p50"), (0.05, "missed"))      # a median: the 5 % floor
        self.assertEqual(j(0.06, 0.02, "tpot_p90"), (0.10, "met"))        # p90: a tail, the 10 % floor
        self.assertTrue(tt.is_nan(self.se.spread_of([10.0])))
        self.assertAlmostEqual(self.se.spread_of([9.0, 10.0, 11.0]), 0.2)

    def test_step_errors_start_to_start(self):
        """#39: a step's price is judged against the time it held its instance (start to the next
        step's start), which is what a profile with a loop gap prices; not against compute alone."""
        d = os.path.join(self.tmp, "steps")
        os.makedirs(d)
        cols = "step,instance,start_s,elapsed_ms,n_prefill,n_decode,after_idle,predicted_ms,pred_error\n"
        with open(os.path.join(d, "steps.csv"), "w") as f:
            f.write(cols)
            f.write("0,0,1.000,0.25,0,1,1,0.33,0.32\n")    # held 0.30 ms (0.25 compute + 0.05 host)
            f.write("1,1,1.0001,2.00,1,0,1,2.00,0.0\n")    # instance 1: its next step is after idle
            f.write("2,0,1.0003,0.25,0,1,0,0.30,0.20\n")   # held 0.30 ms: priced exactly
            f.write("3,0,1.0006,0.25,0,1,0,0.30,0.20\n")   # its next step comes after an idle spell
            f.write("4,1,1.0100,2.00,1,0,1,2.00,0.0\n")    # the last of instance 1
            f.write("5,0,1.0200,0.25,0,1,1,0.30,0.20\n")   # the last of instance 0
        kinds = self.se.step_errors([d])
        self.assertEqual(kinds["prefill"], [])               # instance 1: never back to back
        self.assertEqual(len(kinds["decode"]), 2)            # steps 0 and 2
        self.assertAlmostEqual(kinds["decode"][0], 0.10, places=6)
        self.assertAlmostEqual(kinds["decode"][1], 0.0, places=6)
        # An older steps.csv without start_s/after_idle: its pred_error (price vs compute).
        with open(os.path.join(d, "steps.csv"), "w") as f:
            f.write("step,elapsed_ms,n_prefill,n_decode,predicted_ms,pred_error\n0,0.25,0,1,0.30,0.2\n")
        self.assertEqual(self.se.step_errors([d])["decode"], [0.2])
        self.assertEqual(self.se.host_shares([d])["decode"], [])  # no host_ms column: nothing measured
        # host_ms (real backends): its share of the time the step held its instance, back-to-back steps only.
        with open(os.path.join(d, "steps.csv"), "w") as f:
            f.write(cols.rstrip("\n") + ",host_ms\n")
            f.write("0,0,1.000,0.25,0,1,1,0.33,0.32,0.06\n")   # held 0.30 ms, 0.06 of it host
            f.write("1,0,1.0003,0.25,0,1,0,0.30,0.20,\n")     # host not measured: left out
            f.write("2,0,1.0006,0.25,0,1,0,0.30,0.20,0.03\n")  # the last: not back to back
        shares = self.se.host_shares([d])
        self.assertEqual(len(shares["decode"]), 1)
        self.assertAlmostEqual(shares["decode"][0], 0.2, places=6)
        # A run's speed against the profile: the median over its steps of compute / price.
        with open(os.path.join(d, "steps.csv"), "w") as f:
            f.write("step,elapsed_ms,n_prefill,n_decode,predicted_ms\n0,0.50,0,1,1.0\n1,0.60,0,1,1.0\n"
                    "2,9.00,0,1,1.0\n3,1.00,0,1,0\n")  # the outlier moves a median little; no price: left out
        self.assertAlmostEqual(self.se.run_speed(d), 0.60, places=6)
        self.assertIsNone(self.se.run_speed(os.path.join(self.tmp, "nowhere")))

    def test_medians_judged(self):
        """#39: p50s and p90s are judged beside means and p99s; a figure no run holds is not counted."""
        d = os.path.join(self.tmp, "med")
        fig = lambda m, p50, p90, p99: {"mean": m, "p50": p50, "p90": p90, "p99": p99}
        for i, k in enumerate([1.0, 1.02, 0.99], 1):
            os.makedirs(os.path.join(d, "measured_%d" % i))
            with open(os.path.join(d, "measured_%d" % i, "summary.json"), "w") as f:
                json.dump({"ttft_ms": fig(20 * k, 21 * k, 30 * k, 40 * k), "tpot_ms": fig(0.7 * k, 0.68 * k, 0.8, 1.0),
                           "itl_ms": fig(0.7, 0.63 * k, 0.9, 1.2)}, f)
        os.makedirs(os.path.join(d, "simulated"))
        with open(os.path.join(d, "simulated", "summary.json"), "w") as f:  # TPOT p50 21 % low, the rest close
            json.dump({"ttft_ms": fig(20, 21, 30, 40), "tpot_ms": fig(0.7, 0.54, 0.8, 1.0),
                       "itl_ms": fig(0.7, 0.63, 0.9, 1.2)}, f)
        js = os.path.join(self.tmp, "m.json")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.se.main(["--json", js, d])
        self.assertRegex(out.getvalue(), r"med\s+TPOT p50\s+ms\s+0.6800\s+3\s+3.0\s+0.5400\s+-20.6\s+5.0\s+missed")
        self.assertRegex(out.getvalue(), r"med\s+ITL p90\s+ms\s+0.9000\s+3\s+0.0\s+0.9000\s+\+0.0\s+10.0\s+met")
        with open(js) as f:
            c = json.load(f)["cases"][0]
        self.assertEqual(c["verdict"], "missed")
        self.assertEqual(c["figures"]["tpot_p50"]["verdict"], "missed")
        self.assertEqual(c["figures_met"], 10)

    def test_table_json_and_max_spread(self):
        good = self.case("good", [(100, 200, 10, 20), (102, 210, 10.2, 21), (98, 190, 9.8, 19)], (103, 215, 10.4, 21.5))
        bad = self.case("bad", [(100, 200, 10, 20), (101, 201, 10.1, 20.2)], (120, 200, 10, 20))
        noisy = self.case("noisy", [(100, 260, 10, 20), (130, 200, 12, 20)], (100, 200, 10, 20))
        part = self.case("part", [(100, 200, 10, 20), (101, 260, 10.1, 20.2)], (102, 230, 10.2, 20.5))
        one = self.case("one", [(100, 200, 10, 20)], (104, 200, 10, 20))
        js = os.path.join(self.tmp, "e.json")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(self.se.main(["--json", js, good, bad, noisy, one, part]), 0)
        text = out.getvalue()
        self.assertIn("cases within the target (every figure judged met, at least half judged): 3 of 5 (good, one, part)",
                      text)
        self.assertIn("noisy (more than half the figures with a spread above 15 %, not counted): noisy", text)
        self.assertIn("measured once, so no spread (the target is the fixed floor): one", text)
        self.assertIn("of which with noisy figures not counted: part (1 noisy)", text)  # its p99 spread is 26 %
        self.assertRegex(text, r"bad\s+TTFT mean\s+ms\s+100.5\s+2\s+1.0\s+120\s+\+19.4\s+5.0\s+missed")
        with open(js) as f:
            data = json.load(f)  # strict JSON: no NaN (one run has no spread)
        by = {c["case"]: c for c in data["cases"]}
        self.assertEqual([by[n]["verdict"] for n in ("good", "bad", "noisy", "one")], ["met", "missed", "noisy", "met"])
        self.assertIsNone(by["one"]["figures"]["ttft_mean"]["spread"])
        self.assertEqual(by["good"]["figures"]["ttft_p99"]["measured"], [200, 210, 190])
        self.assertAlmostEqual(self.se.max_spread(noisy), 0.30 / 1.15)
        # a measured run that did not finish is left out and named
        os.makedirs(os.path.join(good, "measured_4"))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.se.main([good])
        self.assertIn("measured runs that did not finish (no summary.json, left out): %s" %
                      os.path.join(good, "measured_4"), out.getvalue())
        self.assertRegex(out.getvalue(), r"good\s+TTFT mean\s+ms\s+100\s+3\s")
        shutil.rmtree(os.path.join(good, "measured_4"))
        # a set measured before this one (tools/sim-vs-measured keeps it) is reported
        os.makedirs(os.path.join(good, "set_1"))
        shutil.copytree(os.path.join(noisy, "measured_2"), os.path.join(good, "set_1", "measured_1"))
        shutil.copytree(os.path.join(good, "measured_1"), os.path.join(good, "set_1", "measured_2"))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.se.main([good])
        self.assertIn("good: measured again; the earlier set(s) had a spread of 26.1 %", out.getvalue())


class ResolvedYaml(unittest.TestCase):
    SAMPLE = """name: w
model:
  name: llama3-8b
  max_model_len: 8192
engine:
  policy: continuous
  cuda_attention: "simt"
requests:
  count: 300
  arrival:
    process: poisson
    rate: 20
  prompt_len:
    dist: mixture
    components:
      - dist: uniform
        min: 32
      - dist: uniform
        min: 2048
  output_len:
    dist: uniform
slo:
  ttft_ms: 2000
# predicted step times (ms): decode 1 x 1024 ctx 3.673
"""

    def test_parse(self):
        c = tt.parse_resolved_yaml(self.SAMPLE)
        self.assertEqual(c["name"], "w")
        self.assertEqual(c["model.max_model_len"], "8192")
        self.assertEqual(c["engine.cuda_attention"], "simt")
        self.assertEqual(c["requests.arrival.rate"], "20")
        self.assertEqual(c["requests.prompt_len.dist"], "mixture")
        self.assertEqual(c["requests.output_len.dist"], "uniform")
        self.assertEqual(c["slo.ttft_ms"], "2000")
        self.assertFalse(any(k.endswith(".min") for k in c))  # sequence items are skipped


@unittest.skipUnless(os.access(TANDEM, os.X_OK), "no build/tandem (build it first)")

class SpeedTable(unittest.TestCase):
    """tools/speed_table.py: #23's verdicts from bench_cuda's JSON, and nothing invented."""

    def write(self, d, name, obj):
        with open(os.path.join(d, name), "w") as f:
            json.dump(obj, f)

    def test_verdicts(self):
        sys.path.insert(0, HERE)
        import speed_table as st
        with tempfile.TemporaryDirectory() as d:
            top = {"device": "NVIDIA H200", "copy_tb_per_s": 4.2, "gemm_bf16_tflops": 800.0,
                   "gemm_bf16_pinned_tflops": 790.0}
            # batch 1: 3.6 / 4.0 = 90 % (met); batch 128: 6 / 12 = 50 % (missed, target 60 %)
            det = dict(top, deterministic={
                "decode": [{"batch": 1, "ms": 4.0, "roofline_ms": 3.6}, {"batch": 128, "ms": 12.0, "roofline_ms": 6.0}],
                "prefill": [{"tokens": 2048, "ms": 60.0, "tflops": 500.0}, {"tokens": 512, "ms": 20.0, "tflops": 300.0}]})
            fast = dict(top, fast={"decode": [{"batch": 1, "ms": 3.0, "roofline_ms": 3.6}], "prefill": []})
            self.write(d, "bench_cuda_deterministic.json", det)
            self.write(d, "bench_cuda_fast.json", fast)
            self.write(d, "bench_torch.json", {"decode": [{"batch": 1, "ms": 5.0}, {"batch": 128, "ms": 10.0}],
                                               "prefill": [{"tokens": 2048, "ms": 61.0}]})
            t = st.build(d)
            rows = {(r["mode"], r["kind"], r["size"]): r for r in t["rows"]}
            b1 = rows[("deterministic", "decode", 1)]
            self.assertAlmostEqual(b1["share"], 0.9)
            self.assertTrue(b1["met"])
            self.assertTrue(b1["beats_torch"])
            self.assertFalse(b1["within_fast"])  # 4.0 > 1.15 * 3.0
            self.assertEqual(b1["baseline_ms"], 13.87)
            b128 = rows[("deterministic", "decode", 128)]
            self.assertEqual(b128["target"], 0.60)
            self.assertFalse(b128["met"])
            self.assertFalse(b128["beats_torch"])  # 12 ms against 10 ms
            self.assertIsNone(b128["within_fast"])  # fast has no batch 128: not judged
            p2k = rows[("deterministic", "prefill", 2048)]
            self.assertAlmostEqual(p2k["share"], 500.0 / 800.0)
            self.assertTrue(p2k["met"])
            self.assertIsNone(rows[("deterministic", "prefill", 512)]["met"])  # no target below 2k
            self.assertEqual(t["torch_source"], "this run")
            text = st.render(t)
            self.assertIn("missed", text)
            self.assertIn("deterministic", text)

    def test_winners(self):
        """A switch is chosen only when its correctness passed and its mode beat what it replaces."""
        sys.path.insert(0, HERE)
        import speed_table as st
        base = st.BASELINE
        with tempfile.TemporaryDirectory() as d:
            top = {"device": "NVIDIA H200", "copy_tb_per_s": 4.2, "gemm_bf16_tflops": 800.0,
                   "gemm_bf16_pinned_tflops": 790.0}

            def mode(name, scale):  # every shape at `scale` times the 2026-11-30 baseline's time
                self.write(d, "bench_cuda_%s.json" % name, dict(top, **{name: {
                    "decode": [{"batch": b, "ms": ms * scale, "roofline_ms": 3.5} for b, ms in base["decode"].items()],
                    "prefill": [{"tokens": t, "ms": ms * scale, "tflops": 100.0} for t, ms in base["prefill"].items()]}}))
            mode("deterministic_split", 0.5)       # 2x the baseline
            mode("deterministic_mma_split", 0.25)  # 4x
            mode("deterministic_split_v2", 0.55)   # slower than split: v2 loses
            mode("deterministic_own_split_v2", 0.5)
            t = st.build(d)
            self.assertAlmostEqual(st.speedup(t, "deterministic_split"), 2.0)
            self.assertAlmostEqual(st.speedup(t, "deterministic_own_split_v2", "deterministic_split_v2"), 1.1)
            all_passed = {"split": True, "mma_split": True, "v2": True, "own": True}
            settings, why = st.winners(t, all_passed)
            self.assertEqual(settings, ["engine.cuda_attention=mma_split", "engine.cuda_gemm=own"])
            self.assertIn("the other split-KV kernel is faster", why["split"])
            self.assertIn("0.91x deterministic_split: not chosen", why["v2"])
            # mma_split's cases failed: split, the next fastest, is chosen; own not run: not chosen
            settings, why = st.winners(t, dict(all_passed, mma_split=False, own=None))
            self.assertEqual(settings, ["engine.cuda_attention=split"])
            self.assertIn("correctness failed, 4.00x the 2026-11-30 baseline: not chosen", why["mma_split"])
            self.assertIn("correctness not run", why["own"])
            line = st.mode_line(t, "deterministic_split")
            self.assertRegex(line, r"^decode b1 6\.93\d* ms \d+% (met|missed), b64 .*, prefill 2k 75\.25 ms")
            self.assertTrue(line.endswith("; 2.00x the 2026-11-30 baseline"))
        with tempfile.TemporaryDirectory() as d:  # no bench figures: the defaults
            self.assertEqual(st.winners(st.build(d), all_passed)[0], [])
            self.assertEqual(st.mode_line(st.build(d), "deterministic_split"), "")

    def test_missing_files(self):
        sys.path.insert(0, HERE)
        import speed_table as st
        with tempfile.TemporaryDirectory() as d:
            t = st.build(d)
            self.assertEqual(t["rows"], [])
            self.assertEqual(t["torch_source"], "2026-11-30")  # the stored reference, labelled
            self.assertIn("no bench_cuda results", st.render(t))
            self.assertEqual(st.main([os.path.join(d, "absent")]), 2)


class PtxEntries(unittest.TestCase):
    """tools/ptx_entries.py: a kernel's PTX before and after, names and labels normalised."""

    def ptx(self, file_hash, fn, body):
        name = f"_ZN6tandem4cuda43_GLOBAL__N__{file_hash}_10_kernels_cu_3cca693918add_rmsnorm_kernelEPf"
        return (f".visible .entry {name}(\n\t.param .u64 p0\n)\n{{\n$L__BB{fn}_1:\n\t{body}\n"
                f"\t@%p1 bra $L__BB{fn}_1;\n}}\n")

    def test_normalised_and_judged(self):
        import ptx_entries as pe
        old = pe.entries(self.ptx("7554c530", 0, "fma.rn.f32 %f1, %f2, %f3, %f1;"))
        moved = pe.entries(self.ptx("0badf00d", 3, "fma.rn.f32 %f1, %f2, %f3, %f1;"))  # another hash, label
        self.assertEqual(len(old), 1)
        self.assertEqual(pe.compare(old, moved), [("SAME", next(iter(old)))])
        changed = pe.entries(self.ptx("7554c530", 0, "mul.f32 %f1, %f2, %f3;"))
        self.assertEqual(pe.compare(old, changed)[0][0], "CHANGED")
        self.assertEqual(pe.compare(old, {})[0][0], "GONE")
        self.assertEqual(pe.compare({}, old)[0][0], "NEW")

    def test_exit_status(self):
        import ptx_entries as pe
        with tempfile.TemporaryDirectory() as d:
            a, b, c = (os.path.join(d, n) for n in ("a.ptx", "b.ptx", "c.ptx"))
            with open(a, "w") as f:
                f.write(self.ptx("7554c530", 0, "add.f32 %f1, %f2, %f3;"))
            with open(b, "w") as f:
                f.write(self.ptx("7554c530", 0, "sub.f32 %f1, %f2, %f3;"))
            with open(c, "w") as f:
                f.write("")
            with contextlib.redirect_stdout(io.StringIO()):
                self.assertEqual(pe.main([a, a]), 0)
                self.assertEqual(pe.main([a, b]), 1)  # changed
                self.assertEqual(pe.main([c, a]), 0)  # only new
                self.assertEqual(pe.main([a, c]), 1)  # gone

class RefactorCheckDrop(unittest.TestCase):
    """tools/refactor-check --drop-summary-key: dotted paths out of summary.json, through lists."""

    def test_drop_key(self):
        import importlib.util
        from importlib.machinery import SourceFileLoader
        loader = SourceFileLoader("refactor_check", os.path.join(HERE, "refactor-check"))  # no .py suffix
        rc = importlib.util.module_from_spec(importlib.util.spec_from_loader("refactor_check", loader))
        loader.exec_module(rc)
        s = {"ttft_ms": {"p99": 1}, "utilisation": {"mfu": 0.2},
             "instances": [{"id": 0, "mfu": 0.1, "model_flops": 5}, {"id": 1, "mfu": None, "model_flops": 6}]}
        for path in ("utilisation", "instances.mfu", "instances.model_flops", "absent.key", "ttft_ms.p50"):
            rc.drop_key(s, path)
        self.assertEqual(s, {"ttft_ms": {"p99": 1}, "instances": [{"id": 0}, {"id": 1}]})


class DoctestOutput(unittest.TestCase):
    SAMPLE = """[doctest] doctest version is "2.4.9"
===============================================================================
../tests/test_cuda_model.cpp:289:
TEST CASE:  golden on the GPU: static vs continuous, CUDA Graphs on and off, token-identical (each attention kernel)

../tests/test_cuda_model.cpp:270: ERROR: test case THREW exception: no such file
===============================================================================
[doctest] test cases:  10 |  9 passed | 1 failed | 12 skipped
[doctest] assertions:  32 | 32 passed | 0 failed |
[doctest] Status: FAILURE!
[doctest] test cases:   2 |  2 passed | 0 failed | 20 skipped
[doctest] assertions: 904 | 903 passed | 1 failed |
"""

    def test_counts_and_failures(self):
        c = tt.doctest_counts(self.SAMPLE)  # two processes' summaries, summed
        self.assertEqual(c, {"cases": 12, "passed": 11, "failed": 1, "skipped": 32, "assertions": 936,
                             "assertions_failed": 1})
        self.assertIsNone(tt.doctest_counts("SKIP: no CUDA device\n"))
        self.assertEqual(tt.doctest_failed_cases(self.SAMPLE),
                         ["golden on the GPU: static vs continuous, CUDA Graphs on and off, token-identical "
                          "(each attention kernel)"])


def sh(script):
    return lambda ctx: ["sh", "-c", script]


class TimeKeeper(unittest.TestCase):
    """tandem_tools.TimeKeeper: limits, skips, kills at the limit keeping what was written, the archive."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tandem-keeper-test-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_steps(self):
        out = os.path.join(self.tmp, "out")
        def read(ctx, r):
            with open(os.path.join(ctx.folder, "a.txt")) as f:
                return f.read().strip()
        steps = [
            tt.TimedStep("ok", 5, sh('echo first > "$OUT/a.txt"'), read, keep=["a.txt"]),
            # writes, leaves a grandchild, then runs past its limit: killed at 1 s, its file kept
            tt.TimedStep("slow", 1, sh('sleep 60 & echo $! > "$OUT/child.pid"; echo partial > "$OUT/b.txt"; wait')),
            tt.TimedStep("no device", 5, sh("exit 77"), lambda ctx, r: "exit %s seen" % r["rc"]),
            tt.TimedStep("too long", 1000, sh("touch \"$OUT/never\"")),
            tt.TimedStep("last", 1, sh("sleep 1.5"), stretch=True),  # may use what is left: not killed
        ]
        lines = []
        keeper = tt.TimeKeeper(steps, 20, out, root=self.tmp, archive="k.tar.gz", title="== test",
                               report=lambda results: "report after %d steps" % len(results), log=lines.append)
        self.assertEqual(keeper.limits_line(),
                         "limits: ok 5 s, slow 1 s, no device 5 s, too long 1000 s, last 1 s (or what is left, if "
                         "more); sum 1012 s > 20")
        r = keeper.run()
        self.assertEqual([r[s.name]["status"] for s in steps], ["0", "124", "77", "skipped", "0"])
        self.assertGreaterEqual(r["slow"]["used"], 1.0)
        self.assertLess(r["slow"]["used"], 4.0)
        self.assertGreater(r["last"]["limit"], 10)  # stretched to what was left of 20 s
        self.assertEqual(r["ok"]["figures"], "first")
        self.assertEqual(r["no device"]["figures"], "exit 77 seen")
        self.assertRegex(r["too long"]["figures"], r"would not fit: \d+ s left of 20 s")
        # the steps' folder is archived, then removed; the kept file and the table stay
        self.assertEqual(sorted(os.listdir(out)), ["a.txt", "k.tar.gz", "progress.txt", "summary.txt"])
        with tarfile.open(os.path.join(out, "k.tar.gz")) as tar:
            names = tar.getnames()
            self.assertIn("steps/ok/a.txt", names)
            self.assertEqual(tar.extractfile("steps/slow/b.txt").read(), b"partial\n")
            self.assertIn(b"killed at its limit of 1 s", tar.extractfile("steps/slow/slow.log").read())
            self.assertNotIn("steps/too-long/never", names)
            child = int(tar.extractfile("steps/slow/child.pid").read())
        # the grandchild went with the step (gone, or a zombie waiting to be reaped)
        try:
            with open("/proc/%d/stat" % child) as f:
                self.assertEqual(f.read().rsplit(")", 1)[1].split()[0], "Z")
        except FileNotFoundError:
            pass
        with open(os.path.join(out, "summary.txt")) as f:
            text = f.read()
        rows = [l.split()[0] for l in text.splitlines()[2:7]]
        self.assertEqual(rows, ["ok", "slow", "no", "too", "last"])  # in order, after the title and header
        self.assertRegex(text, r"slow\s+1\s+\d\.\d\s+124")
        self.assertRegex(text, r"too long\s+1000\s+-\s+skipped\s+would not fit")
        self.assertIn("sum of the limits 1012 s (budget 20 s)", text)
        self.assertIn("report after 5 steps", text)
        with open(os.path.join(out, "progress.txt")) as f:
            self.assertIn("sum 1012 s > 20", f.read())

    def test_stop_on_sigterm(self):
        """SIGTERM stops the step running; the table says so and is written, with the archive."""
        import signal
        import subprocess
        import time
        out = os.path.join(self.tmp, "out")
        script = ("import sys; sys.path.insert(0, %r); import tandem_tools as tt\n"
                  "steps = [tt.TimedStep('long', 60, lambda c: ['sh', '-c', 'echo started > \"$OUT/s.txt\"; sleep 60']),"
                  " tt.TimedStep('after', 5, lambda c: ['true'])]\n"
                  "r = tt.TimeKeeper(steps, 100, %r).run()\n"
                  "print(r['long']['status'], r['after']['status'])\n" % (HERE, out))
        p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True)
        deadline = time.time() + 20
        while not os.path.exists(os.path.join(out, "steps", "long", "s.txt")) and time.time() < deadline:
            time.sleep(0.05)
        t0 = time.time()
        p.send_signal(signal.SIGTERM)
        stdout, _ = p.communicate(timeout=20)
        self.assertLess(time.time() - t0, 10)
        self.assertEqual(p.returncode, 0)
        self.assertEqual(stdout.strip(), "stopped not run")
        with open(os.path.join(out, "summary.txt")) as f:
            self.assertRegex(f.read(), r"after\s+5\s+-\s+not run\s+stopped before it")
        with tarfile.open(os.path.join(out, "steps.tar.gz")) as tar:
            self.assertEqual(tar.extractfile("steps/long/s.txt").read(), b"started\n")


def load_tool(name):
    """A tools/ script without a .py suffix, as a module."""
    from importlib.machinery import SourceFileLoader
    import importlib.util
    loader = SourceFileLoader(name.replace("-", "_"), os.path.join(HERE, name))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def doctest_matches(name, pattern):
    """doctest's -tc matching: * and ? wildcards over the whole name, case-insensitive."""
    rx = "".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern)
    return re.fullmatch(rx, name, re.I | re.S) is not None


class DevicePending(unittest.TestCase):
    """tools/device-check --pending (tools/device-pending): #38's prepared call, within 480 s."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tandem-pending-test-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_dry_run_plan(self):
        import subprocess
        out = os.path.join(self.tmp, "out")
        r = subprocess.run([os.path.join(ROOT, "tools", "device-check"), "--pending", "--dry-run"], cwd=ROOT,
                           env=dict(os.environ, OUT=out), capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(os.path.exists(out))  # nothing ran, nothing written
        m = re.search(r"^limits: (.*); sum (\d+) s <= 480$", r.stdout, re.M)
        self.assertIsNotNone(m, r.stdout)
        total = int(m.group(2))
        self.assertLessEqual(total, 480)
        steps = re.findall(r"^\s*(\d+)\. (.+?) \(limit (\d+) s", r.stdout, re.M)
        self.assertEqual(sum(int(s[2]) for s in steps), total)  # the printed sum is the steps' limits
        self.assertEqual([int(s[0]) for s in steps], list(range(1, len(steps) + 1)))
        names = [s[1] for s in steps]
        kinds = [n.split()[0] for n in names]
        self.assertEqual(names[0], "stage 4")  # what the project most needs to know first
        self.assertEqual(kinds, ["stage"] + ["suite"] * 3 + ["bench"] * 4 + ["calibration"])
        self.assertIn("tools/device-check --stage4", r.stdout)
        self.assertIn("tools/device-calibrate --profile-only", r.stdout)
        self.assertIn("timeout_s 540", r.stdout)
        self.assertEqual(subprocess.run([os.path.join(ROOT, "tools", "device-pending"), "--bogus"],
                                        capture_output=True).returncode, 2)

    def test_suite_patterns_select_the_switches_cases(self):
        """Each switch's -tc patterns select exactly the cases the tool expects in tests/test_cuda_*.cpp."""
        dp = load_tool("device-pending")
        names = []
        for path in glob.glob(os.path.join(ROOT, "tests", "test_cuda_*.cpp")):
            with open(path) as f:
                for m in re.finditer(r'TEST_CASE\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)\)', f.read()):
                    names.append("".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1))))
        self.assertGreater(len(names), 30)
        covered = set()
        for label, switches, limit, patterns, expected in dp.SUITE:
            chosen = [n for n in names if any(doctest_matches(n, p) for p in patterns)]
            self.assertEqual(len(chosen), expected, (label, chosen))
            for p in patterns:  # no pattern is dead
                self.assertTrue(any(doctest_matches(n, p) for n in names), p)
            covered.update(switches)
        self.assertEqual(covered, set(dp.speed_table.SWITCHES))  # every switch has its cases

    def test_calibration_takes_the_winners(self):
        """The calibration step's command: --set for each switch whose suite step ran every expected case
        and passed and whose bench mode beat what it replaces; the defaults without bench figures."""
        dp = load_tool("device-pending")
        steps = dp.plan("build-device")
        cal = steps[-1]
        steps_dir = os.path.join(self.tmp, "steps")
        os.makedirs(os.path.join(steps_dir, "suite"))
        os.makedirs(os.path.join(steps_dir, "bench"))
        results = {}
        for step, rc, ran in ((steps[1], 0, None), (steps[2], 0, 1), (steps[3], 1, None)):  # v2 ran 1 of 3 cases
            log = os.path.join(steps_dir, "suite", step.slug + ".log")
            n = step.expected if ran is None else ran
            with open(log, "w") as f:
                f.write("[doctest] test cases: %d | %d passed | 0 failed | 20 skipped\n" % (n, n - (rc != 0)))
            results[step.name] = {"status": str(rc), "rc": rc, "log": log}
        ctx = tt.StepContext(cal, steps_dir, results)
        self.assertEqual(cal.command(ctx), ["tools/device-calibrate", "--profile-only", "--budget", "50"])
        top = {"device": "H200", "copy_tb_per_s": 4.2, "gemm_bf16_tflops": 800.0, "gemm_bf16_pinned_tflops": 790.0}
        base = dp.speed_table.BASELINE
        for mode, scale in (("deterministic_split", 0.5), ("deterministic_mma_split", 0.4),
                            ("deterministic_split_v2", 0.25), ("deterministic_own_split_v2", 0.2)):
            with open(os.path.join(steps_dir, "bench", "bench_cuda_%s.json" % mode), "w") as f:
                json.dump(dict(top, **{mode: {"decode": [{"batch": b, "ms": ms * scale, "roofline_ms": 3.5}
                                                         for b, ms in base["decode"].items()]}}), f)
        # split and mma_split passed (mma_split faster); v2 ran too few cases; own failed
        self.assertEqual(cal.command(ctx), ["tools/device-calibrate", "--profile-only", "--budget", "50",
                                            "--set", "engine.cuda_attention=mma_split"])
        text = dp.report(results, steps, steps_dir)
        self.assertIn("v2        correctness failed", text)
        self.assertIn("own       correctness failed", text)
        self.assertIn("deterministic_own_split_v2", text)  # speed_table's table of the modes

    def test_rehearsal_without_a_gpu(self):
        """The real run on this machine's build, where there is no GPU: every step exits 77, the table
        and the archive are written."""
        import subprocess
        build = os.path.dirname(TANDEM)
        cuda_tests = os.path.join(build, "tests", "cuda_tests")
        if not os.access(cuda_tests, os.X_OK):
            self.skipTest("no CUDA backend in this build")
        if subprocess.run([cuda_tests, "--list-test-cases"], capture_output=True).returncode != 77:
            self.skipTest("a CUDA device is here: the rehearsal would run the real thing")
        out = os.path.join(self.tmp, "out")
        r = subprocess.run([os.path.join(ROOT, "tools", "device-check"), "--pending", "--build", build], cwd=ROOT,
                           env=dict(os.environ, OUT=out), capture_output=True, text=True, timeout=110)
        self.assertEqual(r.returncode, 77, r.stdout + r.stderr)
        rows = re.findall(r"^(stage 4|suite \S+|bench \S+|calibration)\s+(\d+)\s+(\S+)\s+(\S+)", r.stdout, re.M)
        self.assertEqual(len(rows), 9, r.stdout)
        self.assertEqual({row[3] for row in rows}, {"77"}, r.stdout)
        self.assertIn("the calibration ran under: the defaults", r.stdout)
        self.assertEqual(sorted(os.listdir(out)), ["device-pending.tar.gz", "progress.txt", "summary.txt"])
        with tarfile.open(os.path.join(out, "device-pending.tar.gz")) as tar:
            names = tar.getnames()
        for name in ("steps/stage4/cuda_pd_tests.log", "steps/stage4/summary.txt", "steps/suite/suite-v2.log",
                     "steps/bench/bench-split.log", "steps/calibration/summary.txt", "summary.txt"):
            self.assertIn(name, names)


class RealRun(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tandem-tools-test-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_sim_vs_measured(self):
        """tools/sim-vs-measured end to end with a shipped profile: two cases of a few requests,
        measured twice each, round the cases; the table, errors.json and the conditions."""
        if not os.access(TANDEM, os.X_OK):
            self.skipTest("no tandem binary at %s" % TANDEM)
        import subprocess
        tool = os.path.join(ROOT, "tools", "sim-vs-measured")
        out = os.path.join(self.tmp, "svm")
        bad = subprocess.run([tool, "--reps", "1", "x.yaml"], capture_output=True, text=True)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("--reps 1: at least 2", bad.stderr)
        cases = ["workloads/cpu_tiny.yaml@requests.count=3", "workloads/cpu_tiny.yaml@requests.count=4"]
        r = subprocess.run([tool, "--tandem", TANDEM, "--profile", "workloads/profiles/cpu-tiny-profiled.yaml",
                            "--reps", "2", "--remeasure", "0", "--out", out] + cases,
                           capture_output=True, text=True, cwd=ROOT, timeout=100)
        self.assertEqual(r.returncode, 0, r.stderr)
        # round the cases: count=3 run 1, count=4 run 1, count=3 run 2, ...
        order = [line.split("--out ")[1] for line in r.stderr.splitlines() if "--backend cpu" in line and "+ " in line]
        self.assertEqual([os.path.relpath(o, out) for o in order],
                         ["cpu_tiny_count=3/measured_1", "cpu_tiny_count=4/measured_1",
                          "cpu_tiny_count=3/measured_2", "cpu_tiny_count=4/measured_2"])
        self.assertIn("target %", r.stdout)
        self.assertRegex(r.stdout, r"cases within the target \(every figure judged met, at least half judged\): \d of 2")
        with open(os.path.join(out, "errors.json")) as f:
            data = json.load(f)
        self.assertEqual(sorted(c["case"] for c in data["cases"]), ["cpu_tiny_count=3", "cpu_tiny_count=4"])
        for c in data["cases"]:
            self.assertEqual(c["runs"], 2)
            self.assertIn(c["verdict"], ("met", "missed", "noisy"))
            self.assertEqual(len(c["figures"]["ttft_mean"]["measured"]), 2)
        with open(os.path.join(out, "cpu_tiny_count=3", "conditions.txt")) as f:
            self.assertRegex(f.read(), r"before measured_2 \(set 1\): load average [0-9.]+")

    def test_run_and_read(self):
        workload = os.path.join(ROOT, "workloads", "quickstart.yaml")
        sets = ["requests.count=5", "engine.max_num_batched_tokens=4096"]
        runner = tt.Runner("test", TANDEM, workload, self.tmp, sets=sets, total=1)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rec = runner.run("a", ["engine.policy=static"])
        self.assertRegex(err.getvalue(), r"^\[1/1\] a: \d+\.\d s\n$")
        run_dir = os.path.join(self.tmp, "a")
        self.assertFalse(os.path.exists(os.path.join(run_dir, "trace.json")))  # --trace none by default
        self.assertEqual(len(rec["requests"]), 5)
        self.assertEqual(tt.metric(rec["summary"], "finished"), 5)
        cfg = tt.read_resolved(run_dir)
        self.assertEqual(cfg["requests.count"], "5")
        self.assertEqual(cfg["engine.policy"], "static")
        self.assertEqual(cfg["engine.max_num_batched_tokens"], "4096")
        self.assertEqual(int(cfg["model.max_model_len"]), 8192)
        self.assertEqual(int(cfg["engine.max_num_batched_tokens"]), rec["summary"]["engine"]["max_num_batched_tokens"])
        # `tandem validate` prints the same configuration before any run
        before = tt.resolve_config(TANDEM, workload, sets + ["engine.policy=static"])
        self.assertEqual(before, cfg)
        self.assertIn("1 runs in", runner.where())


if __name__ == "__main__":
    unittest.main()
