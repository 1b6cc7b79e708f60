#!/usr/bin/env python3
"""The CUDA speed issue's table (#23): bench_cuda's modes beside the targets and the first run.

    tools/speed_table.py DIR [--json OUT.json]

DIR holds what tools/device-speed writes: bench_cuda_<mode>.json (one per mode),
bench_ops.json (bench_cuda --ops) and bench_torch.json (tools/bench-torch.py), any of them
missing. Prints, per mode, decode at each batch (ms, % of the memory roofline, the target it is
held to, met or missed) and prefill at each length (ms, % of the measured GEMM rate), the
2026-11-30 baseline (deterministic mode, same card) and PyTorch beside them; then the per-op
table of one layer. The targets (deterministic mode; the numerics contract holds):
  decode >= 75 % of the memory roofline at batch 1-64 (batch 1 at 1k: <= 4.7 ms),
         >= 60 % at 128-256;
  prefill >= 60 % of the measured GEMM rate at 2k and 8k;
  faster than PyTorch at every shape; deterministic within 15 % of fast mode.
A figure the run did not produce is "-", never a guess.
As a module (tools/device-pending): build(DIR), render(table), mode_line(table, mode), and
speedup/winners: which of #23's switches a run supports (SWITCHES).
"""
import argparse
import json
import math
import os
import sys

# The first GPU run (2026-11-30, one H200, tools/device-check at 30da630): deterministic mode,
# simt attention, GEMMs pinned at 256 tokens (../shared/measurements/2026-11-30-h200/summary.txt).
BASELINE = {
    "decode": {1: 13.87, 8: 12.66, 32: 13.49, 64: 13.59, 128: 18.08, 256: 28.19},
    "prefill": {512: 23.64, 2048: 150.50, 8192: 1623.53},
}
BASELINE_TORCH = {
    "decode": {1: 36.49, 8: 51.73, 32: 33.11, 64: 53.89, 128: 96.68, 256: 182.85},
    "prefill": {512: 36.98, 2048: 60.37, 8192: 252.35},
}
MODES = ["deterministic", "deterministic_split", "deterministic_mma_split", "deterministic_split_v2",
         "deterministic_own_split_v2",
         "deterministic_mma", "deterministic_pin64", "fast"]


# The switches of #23: the engine setting, the bench_cuda mode that measures it, and the mode it
# replaces (None: the 2026-11-30 baseline). v2 and own are measured over split attention, each
# against the mode without it.
SWITCHES = {
    "split": ("engine.cuda_attention=split", "deterministic_split", None),
    "mma_split": ("engine.cuda_attention=mma_split", "deterministic_mma_split", None),
    "v2": ("engine.cuda_row_kernels=v2", "deterministic_split_v2", "deterministic_split"),
    "own": ("engine.cuda_gemm=own", "deterministic_own_split_v2", "deterministic_split_v2"),
}


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def decode_target(batch):
    return 0.75 if batch <= 64 else 0.60


def fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def verdict(ok):
    return "-" if ok is None else ("met" if ok else "missed")


def build(d):
    """Everything the table shows, as plain data (also written with --json)."""
    modes, ceilings = {}, {}
    for mode in MODES:
        part = load(os.path.join(d, f"bench_cuda_{mode}.json"))
        if not part or mode not in part:
            continue
        ceilings = ceilings or {k: part.get(k) for k in ("device", "copy_tb_per_s", "gemm_bf16_tflops",
                                                          "gemm_bf16_pinned_tflops")}
        modes[mode] = part[mode]
    torch = load(os.path.join(d, "bench_torch.json"))
    torch_src = "this run"
    if torch:
        t_dec = {int(x["batch"]): x.get("ms") for x in torch.get("decode", [])}
        t_pre = {int(x["tokens"]): x.get("ms") for x in torch.get("prefill", [])}
    else:
        t_dec, t_pre, torch_src = BASELINE_TORCH["decode"], BASELINE_TORCH["prefill"], "2026-11-30"
    fast = modes.get("fast", {})
    fast_dec = {int(x["batch"]): x["ms"] for x in fast.get("decode", [])}
    fast_pre = {int(x["tokens"]): x["ms"] for x in fast.get("prefill", [])}
    gemm_rate = ceilings.get("gemm_bf16_tflops")
    rows = []
    for mode, m in modes.items():
        for x in m.get("decode", []):
            b, ms = int(x["batch"]), x["ms"]
            share = x["roofline_ms"] / ms if ms else None
            tm = t_dec.get(b)
            row = {"mode": mode, "kind": "decode", "size": b, "ms": ms, "share": share,
                   "target": decode_target(b), "baseline_ms": BASELINE["decode"].get(b), "torch_ms": tm,
                   "fast_ms": fast_dec.get(b)}
            row["met"] = None if share is None else share >= row["target"]
            row["beats_torch"] = None if tm is None else ms < tm
            row["within_fast"] = None if mode == "fast" or b not in fast_dec else ms <= 1.15 * fast_dec[b]
            rows.append(row)
        for x in m.get("prefill", []):
            t, ms = int(x["tokens"]), x["ms"]
            share = x["tflops"] / gemm_rate if gemm_rate else None
            tm = t_pre.get(t)
            row = {"mode": mode, "kind": "prefill", "size": t, "ms": ms, "share": share,
                   "target": 0.60 if t >= 2048 else None, "baseline_ms": BASELINE["prefill"].get(t),
                   "torch_ms": tm, "fast_ms": fast_pre.get(t)}
            row["met"] = None if share is None or row["target"] is None else share >= row["target"]
            row["beats_torch"] = None if tm is None else ms < tm
            row["within_fast"] = None if mode == "fast" or t not in fast_pre else ms <= 1.15 * fast_pre[t]
            rows.append(row)
    ops = load(os.path.join(d, "bench_ops.json")) or {}
    return {"ceilings": ceilings, "torch_source": torch_src, "rows": rows, "layer_ops": ops.get("layer_ops", [])}


def speedup(t, mode, against=None):
    """How many times faster `mode` is than `against` (a mode, or None: the 2026-11-30 baseline):
    the geometric mean of their time ratios over the shapes both have (decode and prefill alike);
    None when they share none."""
    def times(m):
        if m is None:
            return {(k, size): ms for k in ("decode", "prefill") for size, ms in BASELINE[k].items()}
        return {(r["kind"], r["size"]): r["ms"] for r in t["rows"] if r["mode"] == m and r["ms"]}
    a, b = times(mode), times(against)
    shared = [k for k in a if k in b and b[k]]
    if not shared:
        return None
    return math.exp(sum(math.log(b[k] / a[k]) for k in shared) / len(shared))


def winners(t, passed):
    """Which switches this run supports, for a profile measured under them. A switch wins when its
    correctness passed (passed[switch] true) and its mode is faster than what it replaces (speedup
    above 1); of split and mma_split (one attention kernel) the faster wins. Returns (the settings,
    KEY=VALUE, in SWITCHES' order; {switch: one line saying why}). passed[switch]: True, False
    (failed) or None (not run)."""
    why, won = {}, {}
    for sw, (_, mode, against) in SWITCHES.items():
        x = speedup(t, mode, against)
        than = "the 2026-11-30 baseline" if against is None else against
        figure = "no figures" if x is None else "%.2fx %s" % (x, than)
        ok = passed.get(sw)
        if not ok:
            why[sw] = "correctness %s, %s: not chosen" % ("not run" if ok is None else "failed", figure)
        elif x is None or x <= 1:
            why[sw] = "correctness passed, %s: not chosen" % figure
        else:
            won[sw] = x
            why[sw] = "correctness passed, %s: chosen" % figure
    if "split" in won and "mma_split" in won:
        slower = "split" if won["split"] < won["mma_split"] else "mma_split"
        won.pop(slower)
        why[slower] = why[slower].replace(": chosen", ": not chosen (the other split-KV kernel is faster)")
    return [SWITCHES[sw][0] for sw in SWITCHES if sw in won], why


def mode_line(t, mode):
    """One line of a mode's figures for a summary: decode at batch 1, 64 and 256 and prefill at 2k and
    8k (ms, share of the roofline or GEMM rate, the verdict against #23's target), and the speedup
    over the 2026-11-30 baseline; '' when the mode has no rows."""
    rows = {(r["kind"], r["size"]): r for r in t["rows"] if r["mode"] == mode}
    parts = []
    for kind, size, label in (("decode", 1, "b1"), ("decode", 64, "b64"), ("decode", 256, "b256"),
                              ("prefill", 2048, "2k"), ("prefill", 8192, "8k")):
        r = rows.get((kind, size))
        if r:
            share = "-" if r["share"] is None else "%.0f%%" % (100 * r["share"])
            judged = "" if r["met"] is None else " " + verdict(r["met"])
            parts.append("%s %s %s ms %s%s" % (kind if label in ("b1", "2k") else "", label, fmt(r["ms"]), share,
                                               judged))
    if not parts:
        return ""
    x = speedup(t, mode)
    return ", ".join(p.strip() for p in parts) + ("; %.2fx the 2026-11-30 baseline" % x if x else "")


def render(t):
    out = []
    c = t["ceilings"]
    if c:
        out.append(f"{c.get('device')}: copy {fmt(c.get('copy_tb_per_s'))} TB/s, bf16 GEMM "
                   f"{fmt(c.get('gemm_bf16_tflops'), '.0f')} TFLOP/s")
    if not t["rows"]:
        out.append("no bench_cuda results")
    head = (f"{'mode':<27} {'kind':<7} {'size':>5} {'ms':>9} {'share':>6} {'target':>6} {'verdict':>7} "
            f"{'base ms':>8} {'x base':>6} {'torch ms':>8} {'<torch':>6} {'<=1.15 fast':>11}")
    if t["rows"]:
        out.append(f"share: of the memory roofline (decode, 1k context) or of the GEMM rate (prefill); "
                   f"base: 2026-11-30 deterministic; torch: {t['torch_source']}")
        out.append(head)
    for r in t["rows"]:
        speedup = r["baseline_ms"] / r["ms"] if r["baseline_ms"] and r["ms"] else None
        share = None if r["share"] is None else 100 * r["share"]
        target = None if r["target"] is None else 100 * r["target"]
        out.append(f"{r['mode']:<27} {r['kind']:<7} {r['size']:>5} {fmt(r['ms']):>9} {fmt(share, '.1f'):>6} "
                   f"{fmt(target, '.0f'):>6} {verdict(r['met']):>7} {fmt(r['baseline_ms']):>8} "
                   f"{fmt(speedup, '.2f'):>6} {fmt(r['torch_ms']):>8} {verdict(r['beats_torch']):>6} "
                   f"{verdict(r['within_fast']):>11}")
    for layer in t["layer_ops"]:
        out.append(f"one layer, batch {layer.get('batch')}, context {layer.get('context')} (us per op):")
        for op in layer.get("ops", []):
            out.append(f"  {op.get('op'):<28} {fmt(op.get('us'), '.1f'):>9}")
    return "\n".join(out)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--json", help="also write the table as JSON")
    a = p.parse_args(argv)
    if not os.path.isdir(a.dir):
        print(f"speed_table: {a.dir}: no such directory", file=sys.stderr)
        return 2
    t = build(a.dir)
    print(render(t))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(t, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
