#!/usr/bin/env python3
"""vllm_result.json (sim/outputs/outputs_vllm.cpp) against vLLM v0.34.0's format and tandem's own outputs.

Usage: test_outputs_vllm.py TANDEM SOURCE_DIR

Runs `tandem run` on the quickstart workload and on a variant where requests fail and are
cancelled, then checks: the keys, their order and JSON types are those of the samples in
tests/data/vllm/ (vLLM 0.34.0's `--save-result` and `--save-detailed` shapes, built from its source
onto a real 0.18.0 `--save-result` file and a `--save-detailed` one built
from its source); one per-request entry per request; the figures agree with summary.json and
requests.csv; the statistics are numpy's, recomputed here from the file's own arrays; failed
and cancelled requests are errors, left out of every statistic. Standard library only.
"""
import collections
import csv
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import unittest

TANDEM = SOURCE = None
SAMPLES = "tests/data/vllm"
E2EL_KEYS = ["mean_e2el_ms", "median_e2el_ms", "std_e2el_ms", "p99_e2el_ms"]
ARRAYS = ["input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times", "generated_texts",
          "errors"]
# The two of them vLLM 0.34 keeps in a plain --save-result too (its list of per-request fields to
# drop without --save-detailed names neither).
KEPT_ARRAYS = ["latencies", "queue_times"]
# tandem's keys after vLLM's (as `--metadata` adds keys): the GPUs (vLLM's sweep records carry
# tensor_parallel_size and data_parallel_size, which plot_pareto multiplies; colocated layouts
# only), then SLO attainment over all requests.
GPU_KEYS = ["num_gpus", "tensor_parallel_size", "data_parallel_size"]
TANDEM_KEYS = GPU_KEYS + ["slo_attainment_ttft", "slo_attainment_tpot", "slo_attainment", "slo_attainment_denominator"]


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def json_type(v):
    return {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict"}.get(type(v), "null")


# numpy 2.x: np.percentile(a, p) (method "linear") and np.median of a sorted list.
def np_percentile(s, p):
    v = (len(s) - 1) * (p / 100)
    lo = math.floor(v)
    hi = min(lo + 1, len(s) - 1)
    t = v - lo
    a, b = s[lo], s[hi]
    return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t


def np_median(s):
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def ms_stats(values):
    if not values:
        return 0.0, 0.0, 0.0, 0.0
    s = sorted(values)
    mean = math.fsum(s) / len(s)
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in s) / len(s))
    return mean * 1000, np_median(s) * 1000, std * 1000, np_percentile(s, 99) * 1000


def peaks(r):
    """vLLM's max_output_tokens_per_s and max_concurrent_requests (calculate_metrics), from the arrays.

    vLLM's one-second buckets, of which only those that hold something are kept (a run may span years)."""
    ok = [i for i, e in enumerate(r["errors"]) if e == ""]
    if not ok:
        return 0.0, 0
    start = [r["start_times"][i] for i in ok]
    latency = [r["ttfts"][i] + sum(r["itls"][i]) for i in ok]
    t0 = min(start)
    n = int(math.ceil(max(s + l for s, l in zip(start, latency)) - t0)) + 1
    tokens, conc = collections.Counter(), collections.Counter()
    for k, i in enumerate(ok):
        t = start[k] + r["ttfts"][i]
        times = [t]
        for gap in r["itls"][i]:
            t += gap
            times.append(t)
        for t in times:
            b = int(t - t0)
            if 0 <= b < n:
                tokens[b] += 1
        for sec in range(int(start[k] - t0), int(start[k] + latency[k] - t0) + 1):
            conc[sec] += 1
    return float(max(tokens.values(), default=0)), max(conc.values())


def close(a, b, rel=1e-9, abs_=1e-9):
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


class Run:
    """One `tandem run` into a temporary folder: its vllm_result.json, summary.json and requests."""

    def __init__(self, workload, *extra):
        self.tmp = tempfile.TemporaryDirectory(prefix="tandem-vllm-")
        out = os.path.join(self.tmp.name, "out")
        subprocess.run([TANDEM, "run", workload, "--out", out, "--quiet", *extra], check=True, timeout=300)
        self.out = out
        self.vllm = load(os.path.join(out, "vllm_result.json"))
        self.summary = load(os.path.join(out, "summary.json"))
        with open(os.path.join(out, "requests.csv"), newline="") as f:
            self.requests = list(csv.DictReader(f))


class VllmResultTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.real = load(os.path.join(SOURCE, SAMPLES, "vllm-0.34.0-save-result.json"))
        cls.detailed = load(os.path.join(SOURCE, SAMPLES, "vllm-0.34.0-save-detailed.json"))
        quickstart = os.path.join(SOURCE, "workloads/quickstart.yaml")
        cls.full = Run(quickstart)
        cls.small = Run(quickstart, "--trace", "none")
        # Requests too long for the model fail; a tenth are cancelled half a second after arrival.
        cls.tmp = tempfile.TemporaryDirectory(prefix="tandem-vllm-fail-")
        failing = os.path.join(cls.tmp.name, "failing.yaml")
        with open(quickstart, encoding="utf-8") as f:
            text = f.read().replace("model: llama3-8b", "model: {preset: llama3-8b, max_model_len: 1200}")
        text = text.replace("slo:", "  cancel: {fraction: 0.1, after_s: {dist: fixed, value: 0.5}}\nslo:")
        with open(failing, "w", encoding="utf-8") as f:
            f.write(text)
        cls.failing = Run(failing)

    def assert_shape(self, got, sample, note):
        self.assertEqual(list(got)[-len(TANDEM_KEYS):], TANDEM_KEYS, f"{note}: tandem's keys are not last")
        got = {k: v for k, v in got.items() if k not in TANDEM_KEYS}
        self.assertEqual(list(got), list(sample), f"{note}: keys or their order differ from the sample's")
        for k, v in sample.items():
            want = json_type(v)
            if k == "request_goodput":  # vLLM: null without --goodput; tandem: a number with an slo
                self.assertIn(json_type(got[k]), ("null", "float"), k)
                continue
            self.assertEqual(json_type(got[k]), want, f"{note}: {k} is {json_type(got[k])}, the sample's {want}")
        for k in ARRAYS:
            if k in sample and k != "itls":  # element types (from the detailed sample); itls: lists of floats
                for x in got[k]:
                    self.assertEqual(json_type(x), json_type(self.detailed[k][0]), f"{k} element")
        for gaps in got.get("itls", []):
            self.assertTrue(all(isinstance(x, float) for x in gaps), "itls: floats in seconds")

    def test_shape_is_vllm_0_34_0(self):
        self.assertEqual(set(self.detailed) - (set(ARRAYS) - set(KEPT_ARRAYS)) - set(E2EL_KEYS), set(self.real),
                         "the two samples disagree: the built one must be the real one plus the arrays and e2el")
        self.assert_shape(self.full.vllm, self.detailed, "default run (--save-detailed)")
        # --trace none: the keys of a plain --save-result, with e2el's statistics added.
        real_plus_e2el = dict(self.real, **{k: self.detailed[k] for k in E2EL_KEYS})
        self.assert_shape(self.small.vllm, real_plus_e2el, "--trace none (--save-result)")
        for k, v in self.small.vllm.items():
            if k != "date":
                self.assertEqual(v, self.full.vllm[k], f"{k}: --trace none changed a figure")

    def test_agrees_with_summary(self):
        r, s = self.full.vllm, self.full.summary
        self.assertEqual(r["backend"], "tandem-" + s["backend"])
        self.assertEqual(r["endpoint_type"], r["backend"])
        self.assertEqual(r["model_id"], s["model"])
        self.assertEqual(r["num_prompts"], s["requests"]["total"])
        self.assertEqual(r["request_rate"], 10.0)  # the quickstart's Poisson rate
        self.assertEqual(r["burstiness"], 1.0)
        self.assertEqual(r["completed"], s["requests"]["finished"])
        self.assertEqual(r["failed"], 0)
        self.assertTrue(close(r["duration"], s["makespan_s"]))
        tp = s["throughput"]
        self.assertTrue(close(r["request_throughput"], tp["requests_per_s"]))
        self.assertTrue(close(r["output_throughput"], tp["output_tokens_per_s"]))
        self.assertTrue(close(r["total_token_throughput"], tp["total_tokens_per_s"]))
        self.assertTrue(close(r["request_goodput"], s["goodput"]["requests_per_s"]))
        # Means agree within rounding; TPOT by vLLM's (latency - ttft) / (n - 1) = summary's.
        for name, key in (("ttft", "ttft_ms"), ("tpot", "tpot_ms"), ("e2el", "e2e_ms"), ("itl", "itl_ms")):
            self.assertTrue(close(r[f"mean_{name}_ms"], s[key]["mean"], rel=1e-6), name)
        # p99: numpy interpolates between the two order statistics around rank 0.99 (n - 1);
        # summary.json takes the nearest rank, the lower of the two.
        ttfts = sorted(r["ttfts"])
        lo = math.floor((len(ttfts) - 1) * 0.99)
        self.assertTrue(ttfts[lo] * 1000 - 1e-9 <= r["p99_ttft_ms"] <= ttfts[lo + 1] * 1000 + 1e-9)
        self.assertTrue(close(s["ttft_ms"]["p99"], ttfts[lo] * 1000, rel=1e-9))
        self.assertEqual(sum(map(len, r["itls"])), s["itl_ms"]["count"])

    def test_per_request_arrays(self):
        r = self.full.vllm
        for k in ARRAYS:
            self.assertEqual(len(r[k]), r["num_prompts"], k)
        self.assertEqual(r["completed"], r["num_prompts"])  # none failed: one entry per completed request
        for i, row in enumerate(self.full.requests):  # id (= arrival) order, as requests.csv
            self.assertEqual(r["input_lens"][i], int(row["prompt_len"]))
            self.assertEqual(r["output_lens"][i], int(row["output_len"]))
            self.assertTrue(close(r["ttfts"][i] * 1000, float(row["ttft_ms"]), abs_=1e-6))
            self.assertTrue(close(r["start_times"][i], float(row["arrival_s"]), abs_=1e-9))
            self.assertEqual(len(r["itls"][i]), int(row["output_len"]) - 1)
            self.assertTrue(close(max(r["itls"][i], default=0) * 1000, float(row["itl_max_ms"]), abs_=1e-6))
            e2e = r["ttfts"][i] + math.fsum(r["itls"][i])
            self.assertTrue(close(e2e * 1000, float(row["e2e_ms"]), abs_=1e-6), f"request {i}: ttft + itls != e2e")
        for i, row in enumerate(self.full.requests):  # 0.34's two: latency = e2e; no client-side wait
            self.assertTrue(close(r["latencies"][i] * 1000, float(row["e2e_ms"]), abs_=1e-6), f"request {i}: latency")
        self.assertEqual(set(r["queue_times"]), {0.0})
        self.assertEqual(self.small.vllm["latencies"], r["latencies"])  # kept by a plain --save-result too
        self.assertEqual(set(r["generated_texts"]), {""})  # tandem has no text
        self.assertEqual(set(r["errors"]), {""})
        self.assertEqual(sum(r["output_lens"]), r["total_output_tokens"])
        self.assertEqual(sum(r["input_lens"]), r["total_input_tokens"])

    def assert_statistics(self, r):
        ok = [i for i, e in enumerate(r["errors"]) if e == ""]
        self.assertEqual(len(ok), r["completed"])
        ttft = [r["ttfts"][i] for i in ok]
        e2el = [r["ttfts"][i] + math.fsum(r["itls"][i]) for i in ok]
        tpot = [(e2el[k] - ttft[k]) / (r["output_lens"][i] - 1) for k, i in enumerate(ok) if r["output_lens"][i] > 1]
        itl = [g for i in ok for g in r["itls"][i]]
        self.assertGreater(len(itl), 1000)  # enough gaps that the exact median and p99 are searched for
        for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
            want = ms_stats(values)
            for stat, w in zip(("mean", "median", "std", "p99"), want):
                self.assertTrue(close(r[f"{stat}_{name}_ms"], w, rel=1e-9, abs_=1e-6),
                                f"{stat}_{name}_ms {r[f'{stat}_{name}_ms']} != numpy's {w}")
        self.assertEqual((r["max_output_tokens_per_s"], r["max_concurrent_requests"]), peaks(r))

    def test_statistics_are_numpys(self):
        self.assert_statistics(self.full.vllm)

    def test_failures_are_errors(self):
        r, s, rows = self.failing.vllm, self.failing.summary, self.failing.requests
        req = s["requests"]
        self.assertGreater(req["failed"], 0)
        self.assertGreater(req["cancelled"], 0)
        self.assertEqual(r["completed"], req["finished"])
        self.assertEqual(r["failed"], req["failed"] + req["cancelled"])
        self.assertEqual(r["completed"] + r["failed"], r["num_prompts"])
        for k in ARRAYS:
            self.assertEqual(len(r[k]), r["num_prompts"], k)
        for i, row in enumerate(rows):
            if row["status"] == "finished":
                self.assertEqual(r["errors"][i], "")
                continue
            # vLLM's entry for a failed request: its prompt length, no output, no TTFT, no ITLs.
            want = row["fail_reason"] if row["status"] == "failed" else "cancelled"
            self.assertEqual(r["errors"][i], want)
            self.assertEqual((r["output_lens"][i], r["ttfts"][i], r["itls"][i], r["latencies"][i]), (0, 0.0, [], 0.0))
            self.assertEqual(r["input_lens"][i], int(row["prompt_len"]))
        self.assertIn("exceeds_max_model_len", r["errors"])
        # Attainment divides by every request, failed and cancelled ones counting as misses.
        att = s["attainment"]
        self.assertEqual(r["slo_attainment_denominator"], r["num_prompts"])
        self.assertEqual(att["requests"], r["num_prompts"])
        self.assertEqual(att["not_finished"], r["failed"])
        for key, name in (("slo_attainment_ttft", "ttft"), ("slo_attainment_tpot", "tpot"), ("slo_attainment", "both")):
            self.assertTrue(close(r[key], att[name]["fraction"]), key)
            self.assertTrue(close(r[key] * r["num_prompts"], att[name]["met"]), key)
            self.assertLessEqual(att[name]["met"], r["completed"], key)
        self.assertLess(r["slo_attainment"], s["goodput"]["fraction"])  # goodput.fraction: of finished only
        finished = [row for row in rows if row["status"] == "finished"]
        self.assertEqual(r["total_input_tokens"], sum(int(row["prompt_len"]) for row in finished))
        self.assertEqual(r["total_output_tokens"], sum(int(row["output_len"]) for row in finished))
        self.assertTrue(close(r["mean_ttft_ms"], s["ttft_ms"]["mean"], rel=1e-6))
        self.assertTrue(close(r["request_throughput"], s["throughput"]["requests_per_s"]))
        self.assert_statistics(r)

    def test_gpu_count_keys(self):
        # vLLM's plot_pareto divides by tensor_parallel_size x data_parallel_size (or by the
        # --gpu-count-var key): both only where the layout is colocated replicas, whose GPUs they
        # multiply to; 1P1D has num_gpus alone (P's GPUs + D's), which no TP x DP product describes.
        quickstart = os.path.join(SOURCE, "workloads/quickstart.yaml")
        cases = [  # extra --set, then num_gpus, tensor_parallel_size, data_parallel_size (None: absent)
            ([], 1, 1, 1),
            (["engine.tp=2"], 2, 2, 1),
            (["engine.data_parallel=2"], 2, 1, 2),
            (["engine.tp=2", "engine.data_parallel=2"], 4, 2, 2),
            (["disaggregation.enabled=true"], 2, None, None),
            (["disaggregation.enabled=true", "disaggregation.prefill.tp=2"], 3, None, None),
        ]
        for sets, gpus, tp, dp in cases:
            args = ["--trace", "none", "--set", "requests.count=40"]
            for kv in sets:
                args += ["--set", kv]
            run = Run(quickstart, *args)
            r, layout = run.vllm, run.summary["layout"]
            self.assertEqual(layout["num_gpus"], gpus, sets)  # the figure the keys must repeat
            self.assertEqual(r["num_gpus"], gpus, sets)
            self.assertEqual(r.get("tensor_parallel_size"), tp, sets)
            self.assertEqual(r.get("data_parallel_size"), dp, sets)
            if tp is not None:
                self.assertEqual(tp * dp, r["num_gpus"], sets)
            got = [k for k in r if k in GPU_KEYS]
            self.assertEqual(got, [k for k in GPU_KEYS if k in r], f"{sets}: GPU keys out of order")
            # Right after vLLM's keys, before the attainment ones.
            keys = list(r)
            self.assertEqual(keys[keys.index("num_gpus") - 1], "p99_e2el_ms", sets)
            run.tmp.cleanup()

    def test_memory_follows_requests_not_the_clock(self):
        # Three requests 250 and 500 million seconds apart (a vidur trace, time_scale 1e9): vLLM's
        # per-second buckets would be 750 million (12 GB here before the fix); tandem keeps only
        # the seconds that hold a token, an arrival or a finish. 4 GB of address space is ample,
        # with or without the per-request arrays; not under ASan, which reserves terabytes.
        with tempfile.TemporaryDirectory(prefix="tandem-vllm-clock-") as tmp:
            with open(os.path.join(tmp, "three.csv"), "w", encoding="utf-8") as f:
                f.write("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,374,44\n0.5,396,109\n0.75,879,55\n")
            workload = os.path.join(tmp, "w.yaml")
            with open(workload, "w", encoding="utf-8") as f:
                f.write("model: llama3-8b\nhardware: h200\n"
                        "requests: {trace: {format: vidur, path: three.csv, time_scale: 1e9}}\n")
            asan = "libasan" in subprocess.run(["ldd", TANDEM], capture_output=True, text=True).stdout

            def limit():
                if not asan:
                    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

            got = {}
            for trace in ("full", "none"):
                out = os.path.join(tmp, trace)
                p = subprocess.run([TANDEM, "run", workload, "--out", out, "--quiet", "--trace", trace],
                                   capture_output=True, text=True, timeout=120, preexec_fn=limit)
                self.assertEqual(p.returncode, 0, f"--trace {trace}: {p.stderr.strip()}")
                got[trace] = load(os.path.join(out, "vllm_result.json"))
            r = got["full"]
            self.assertEqual(r["completed"], 3)
            self.assertGreater(r["duration"], 7.5e8)
            self.assertEqual(r["max_concurrent_requests"], 1)  # each request alone, a quarter-billion seconds apart
            self.assertEqual((r["max_output_tokens_per_s"], r["max_concurrent_requests"]), peaks(r))
            for k in ("max_output_tokens_per_s", "max_concurrent_requests"):
                self.assertEqual(got["none"][k], r[k], k)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    TANDEM, SOURCE = os.path.abspath(sys.argv[1]), sys.argv[2]
    unittest.main(argv=sys.argv[:1], verbosity=2)
