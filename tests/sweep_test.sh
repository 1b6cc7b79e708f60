#!/usr/bin/env bash
# `tandem sweep`: bad sweep files (exit 2, file:line:column and the field), a capacity search on
# a workload whose capacity is known, rates that match `tandem run`, resumption, the same
# results from plan + run slices + collect as from one local sweep, and from 1 or 2 threads.
# Usage: sweep_test.sh TANDEM_BINARY SOURCE_DIR
set -u
tandem=$1
src=$(cd "$2" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
passes=0
scale=${TANDEM_TEST_TIME_SCALE:-1}
if [ -z "${TANDEM_TEST_TIME_SCALE:-}" ] && ldd "$tandem" 2>/dev/null | grep -q libasan; then scale=5; fi
limit=$((120 * scale))

fail() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}
ok() { passes=$((passes + 1)); }

# expect STATUS PATTERN -- ARGS...: exit status and a pattern in stdout+stderr.
expect() {
  local want=$1 pattern=$2
  shift 3
  local out rc
  out=$(timeout "$limit" "$tandem" "$@" 2>&1)
  rc=$?
  if ! [[ $rc =~ ^($want)$ ]] || ! grep -qE -- "$pattern" <<<"$out"; then
    fail "tandem $* -> exit $rc (want $want), output:"
    echo "$out" | head -8 | sed 's/^/    /'
    echo "    (wanted /$pattern/)"
  else
    ok
  fi
}

d=$src/tests/data/sweep
bad=$d/bad
expect 2 "unknown_key.yaml:2:1: field 'grdi': unknown field" -- sweep "$bad/unknown_key.yaml" --out "$tmp/x"
expect 2 "both_modes.yaml:1:1: .*give exactly one of rates" -- sweep "$bad/both_modes.yaml" --out "$tmp/x"
expect 2 "bad_grid_value.yaml:3:28: field 'grid.engine.max_num_seqs\[1\]': engine.max_num_seqs=-1 makes the workload invalid: .*out of range" -- sweep "$bad/bad_grid_value.yaml" --out "$tmp/x"
expect 2 "unknown_grid_key.yaml:3:24: .*field 'engine.max_num_seq': unknown field" -- sweep "$bad/unknown_grid_key.yaml" --out "$tmp/x"
expect 2 "hi_below_lo.yaml:5:7: field 'capacity.hi': must be above lo" -- sweep "$bad/hi_below_lo.yaml" --out "$tmp/x"
expect 2 "missing_workload.yaml:1:11: field 'workload': .*cannot open" -- sweep "$bad/missing_workload.yaml" --out "$tmp/x"
expect 2 "duplicate_rate.yaml:2:17: field 'rates\[2\]': given twice" -- sweep "$bad/duplicate_rate.yaml" --out "$tmp/x"
expect 2 "empty_axis.yaml:3:24: field 'grid.engine.max_num_seqs': an empty list" -- sweep "$bad/empty_axis.yaml" --out "$tmp/x"
expect 2 "unknown_slo_term.yaml:3:9: field 'capacity.slo.ttfp_p99_ms': unknown field" -- sweep "$bad/unknown_slo_term.yaml" --out "$tmp/x"
expect 2 "bad_config.yaml:3:5: field 'configs\[0\]': configuration 'a' makes the workload invalid: .*unknown policy" -- sweep "$bad/bad_config.yaml" --out "$tmp/x"
expect 2 "goodput_without_slo.yaml:3:22: field 'capacity.slo.goodput_min': .*the base workload has none" -- sweep "$bad/goodput_without_slo.yaml" --out "$tmp/x"
expect 2 "not_utf8.yaml:3:14: not UTF-8 text \\(byte 0xe9\\)" -- sweep "$bad/not_utf8.yaml" --out "$tmp/x"
expect 2 "sweep: missing SWEEP.yaml" -- sweep
expect 0 "tandem sweep plan SWEEP.yaml" -- sweep --help
expect 2 "plan.json: cannot open" -- sweep run "$tmp/none" --index 0
expect 2 "plan.json: cannot open" -- sweep collect "$tmp/none"

# A known capacity: 1 ms steps, one request at a time; TTFT p99 <= 1.5 ms holds up to 1000.25
# req/s (tests/data/sweep/fixed_step.yaml). The search brackets it within its tolerance (1 %).
expect 0 "base .* found" -- sweep "$d/fixed_step_capacity.yaml" --out "$tmp/fixed"
python3 - "$tmp/fixed/capacity.csv" <<'PY' && ok || fail "known capacity: not found within the tolerance"
import csv, sys
row = list(csv.DictReader(open(sys.argv[1])))[0]
cap, missed, runs = float(row["capacity"]), float(row["first_missed"]), int(row["runs"])
print("fixed_step capacity %.3f, first missed %.3f, %d runs" % (cap, missed, runs))
assert row["status"] == "found", row
assert 1000 * 0.99 <= cap <= 1000.25, cap
assert 1000.25 < missed <= cap * 1.01, (cap, missed)
assert runs == 2 + 9, runs  # 2 ends, then ceil(log2(ln(50) / ln(1.01))) = 9 halvings
assert row["limited_by"].startswith("ttft_p99_ms"), row
PY

# Rates: each row is what `tandem run` at that rate reports.
cat >"$tmp/rates.yaml" <<EOF
workload: $src/workloads/quickstart.yaml
set: {requests.count: 200}
grid:
  engine.max_num_seqs: [8, 64]
rates: [2, 30]
EOF
expect 0 "max_num_seqs=64 +30" -- sweep "$tmp/rates.yaml" --out "$tmp/rates" -j 2
timeout "$limit" "$tandem" run "$src/workloads/quickstart.yaml" --set requests.count=200 --set engine.max_num_seqs=8 \
  --set requests.arrival.rate=30 --out "$tmp/run8" --quiet --trace none || fail "tandem run for the rates check"
python3 - "$tmp/rates/results.csv" "$tmp/run8/summary.json" <<'PY' && ok || fail "rates: a sweep row differs from tandem run"
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 4, len(rows)
row = [r for r in rows if r["engine.max_num_seqs"] == "8" and float(r["rate"]) == 30][0]
s = json.load(open(sys.argv[2]))
for k in ("ttft_ms.p99", "tpot_ms.p50", "itl_ms.p99", "e2e_ms.mean", "throughput.requests_per_s", "steps"):
    a, b = k.split(".") if "." in k else (k, None)
    want = s[a][b] if b else s[a]
    assert abs(float(row[k]) - want) <= 1e-9 * max(1, abs(want)), (k, row[k], want)
assert int(row["requests.finished"]) == s["requests"]["finished"]
# The offered rate beside the configured one, as the run's summary counts it: 200 requests over
# the time to the last arrival, a draw off 30 req/s.
assert float(row["offered_rate"]) == s["arrival"]["offered_rate"], (row["offered_rate"], s["arrival"])
assert s["arrival"]["configured_rate"] == 30 and s["arrival"]["normalized"] is False
assert abs(float(row["offered_rate"]) - 30) > 0.01, row["offered_rate"]
# Utilisation (#34): the busiest instance's busy share and KV peak, as summary.json's instances say.
inst = s["instances"]
assert float(row["utilisation.busy_max"]) == max(i["busy_fraction"] for i in inst), (row, inst)
assert float(row["utilisation.kv_peak_max"]) == max(i["kv_peak_util"] for i in inst), (row, inst)
assert 0 < float(row["utilisation.busy_max"]) <= 1 and row["utilisation.prefill_busy"] == "", row
# ... and its model FLOPs and MFU, as summary.json's utilisation says (h200: a known peak).
u = s["utilisation"]
assert float(row["utilisation.model_flops"]) == u["model_flops"] > 0, (row, u)
assert float(row["utilisation.mfu"]) == u["mfu"] and 0 < u["mfu"] < 1, (row, u)
assert row["utilisation.prefill_mfu"] == "" and row["utilisation.decode_mfu"] == "", row
PY
# ... and in 1P1D each side's busy share, the busiest of the two as busy_max.
cat >"$tmp/pd.yaml" <<EOF
workload: $src/workloads/quickstart.yaml
set: {requests.count: 100}
configs:
  - name: 1p1d
    set: {disaggregation.enabled: true}
rates: [5]
EOF
expect 0 "1p1d" -- sweep "$tmp/pd.yaml" --out "$tmp/pd"
python3 - "$tmp/pd/results.csv" <<'PY' && ok || fail "utilisation: 1P1D rows lack each side's busy share"
import csv, sys
row = list(csv.DictReader(open(sys.argv[1])))[0]
p, d = float(row["utilisation.prefill_busy"]), float(row["utilisation.decode_busy"])
assert 0 < p <= 1 and 0 < d <= 1 and float(row["utilisation.busy_max"]) == max(p, d), row
print("1P1D utilisation: prefill busy %.3f, decode busy %.3f" % (p, d))
# Each side's MFU over its own GPU; the run's over both (alike GPUs: the mean of the two).
pm, dm, m = (float(row["utilisation." + k]) for k in ("prefill_mfu", "decode_mfu", "mfu"))
assert 0 < dm < pm < 1 and abs(m - (pm + dm) / 2) <= 1e-12, row
print("1P1D MFU: prefill %.4f, decode %.4f, run %.4f" % (pm, dm, m))
PY
# MFU is empty, never made up, where the hardware has no peak (a fitted profile): FLOPs still counted.
cat >"$tmp/fitted.yaml" <<EOF
workload: $src/workloads/cpu_tiny.yaml
configs:
  - name: fitted
    set: {hardware: $src/workloads/profiles/cpu-tiny.yaml}
rates: [5]
EOF
expect 0 "fitted" -- sweep "$tmp/fitted.yaml" --out "$tmp/fitted"
python3 - "$tmp/fitted/results.csv" <<'PY' && ok || fail "utilisation: an MFU without a peak"
import csv, sys
row = list(csv.DictReader(open(sys.argv[1])))[0]
assert row["utilisation.mfu"] == "" and float(row["utilisation.model_flops"]) > 0, row
PY
# requests.arrival.normalize: the gaps scaled so the offered rate is the configured one (vLLM's).
cat >"$tmp/norm.yaml" <<EOF
workload: $src/workloads/quickstart.yaml
set: {requests.count: 200, requests.arrival.normalize: true}
rates: [2, 30]
EOF
expect 0 "^base +30 +30 " -- sweep "$tmp/norm.yaml" --out "$tmp/norm" -j 1
python3 - "$tmp/norm/results.csv" <<'PY' && ok || fail "normalize: offered rate is not the configured one"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 2
for r in rows:
    print("normalize: rate %s offered %s" % (r["rate"], r["offered_rate"]))
    assert abs(float(r["offered_rate"]) / float(r["rate"]) - 1) < 1e-9, r
PY

# Resumption: the same sweep again runs nothing; a new grid value runs only its points; --force all.
expect 0 "sweep: 2 points \(2 reused .*\), 0 runs" -- sweep "$tmp/rates.yaml" --out "$tmp/rates"
sed -i 's/\[8, 64\]/[8, 64, 16]/' "$tmp/rates.yaml"
expect 0 "sweep: 3 points \(2 reused .*\), 2 runs" -- sweep "$tmp/rates.yaml" --out "$tmp/rates"
expect 0 "sweep: 3 points \(0 reused .*\), 6 runs" -- sweep "$tmp/rates.yaml" --out "$tmp/rates" --force
# A file the workload reads changes: the points that read it run again.
sed "s|prompt_len: {dist: uniform, min: 4, max: 4}|prompt_len: {dist: empirical, path: lens.csv, column: len}|" \
  "$d/fixed_step.yaml" >"$tmp/fs.yaml"
printf 'len\n4\n' >"$tmp/lens.csv"
printf 'workload: fs.yaml\nrates: [10, 20]\n' >"$tmp/fsr.yaml"
expect 0 "1 points \(0 reused" -- sweep "$tmp/fsr.yaml" --out "$tmp/fsr"
expect 0 "1 points \(1 reused" -- sweep "$tmp/fsr.yaml" --out "$tmp/fsr"
printf 'len\n5\n' >"$tmp/lens.csv"
expect 0 "1 points \(0 reused .*\), 2 runs" -- sweep "$tmp/fsr.yaml" --out "$tmp/fsr"

# plan -> run slices -> collect gives the local sweep's tables, byte for byte; so do 1 and 2 threads.
cat >"$tmp/cap.yaml" <<EOF
workload: $src/workloads/quickstart.yaml
set: {requests.count: 300}
configs:
  - name: small
    set: {engine.max_num_seqs: 8}
  - name: large
    set: {engine.max_num_seqs: 128}
grid:
  engine.enable_chunked_prefill: [false, true]
capacity:
  slo: {ttft_p99_ms: 2000, tpot_p99_ms: 60}
  lo: 1
  hi: 200
  tolerance: 0.05
EOF
expect 0 "small engine.enable_chunked_prefill=false" -- sweep "$tmp/cap.yaml" --out "$tmp/cap1" -j 1
expect 0 "found" -- sweep "$tmp/cap.yaml" --out "$tmp/cap2" -j 2
cmp -s "$tmp/cap1/results.csv" "$tmp/cap2/results.csv" && cmp -s "$tmp/cap1/capacity.csv" "$tmp/cap2/capacity.csv" && ok ||
  fail "1 and 2 threads give different results"
expect 0 "4 points: .*plan.json" -- sweep plan "$tmp/cap.yaml" --out "$tmp/cl"
expect 2 "--index 4: the plan has points 0..3" -- sweep run "$tmp/cl" --index 4
expect 0 "" -- sweep run "$tmp/cl" --index 0 --count 2 -j 1
# Points that never ran are named as such, not sent to results.json for errors they never had (#35).
expect 1 "2 point\(s\) never ran \(no result in .*/cl/results/\): 2, 3; run them with tandem sweep run" -- sweep collect "$tmp/cl"
out=$(timeout "$limit" "$tandem" sweep run "$tmp/cl" --index 2 --count 5 --stdout 2>/dev/null)
[ "$(ls "$tmp/cl/results" | wc -l)" = 2 ] && ok || fail "sweep run --stdout wrote into the plan folder"
python3 -c "import json,sys; a=json.loads(sys.argv[1]); assert [p['index'] for p in a]==[2,3], a" "$out" && ok ||
  fail "sweep run --stdout: not one JSON array of points 2 and 3"
printf '%s\n' "$out" >"$tmp/cl/results/slice-2.json"
expect 0 "found" -- sweep collect "$tmp/cl"
cmp -s "$tmp/cap1/results.csv" "$tmp/cl/results.csv" && cmp -s "$tmp/cap1/capacity.csv" "$tmp/cl/capacity.csv" && ok ||
  fail "plan + run + collect differs from the local sweep"

# A row whose requests did not all finish says so (its percentiles are over fewer requests).
cat >"$tmp/fail.yaml" <<EOF
workload: $src/workloads/quickstart.yaml
set: {requests.count: 100}
grid:
  model.max_model_len: [4096, 600]
rates: [5]
EOF
expect 0 "\* not every request finished" -- sweep "$tmp/fail.yaml" --out "$tmp/fail"
grep -q "latencies over the finished only" "$tmp/fail/results.csv" && ok || fail "results.csv: no note on the unfinished row"
# --keep-runs keeps each run's folder, which `tandem compare` compares on the requests both finished.
expect 0 "not every request finished" -- sweep "$tmp/fail.yaml" --out "$tmp/keep" --keep-runs
expect 0 "over the [0-9]+ requests both finished" -- compare "$tmp/keep/runs/point-0-rate-5" "$tmp/keep/runs/point-1-rate-5"

# Capacity counts every request (#34): a request that fails is a miss. Without chunking, prompts
# over max_num_batched_tokens fail at every rate, and so do prompts over max_model_len: those
# configurations have no capacity (cannot_finish, no number), where counting the finished only
# gave a capacity that fell as the budget grew, and ">= hi" with 97 of 500 finished.
cat >"$tmp/unfinished.yaml" <<EOF
workload: $src/workloads/quickstart.yaml
set: {requests.count: 200, engine.enable_chunked_prefill: false}
configs:
  - name: budget-1024
    set: {engine.max_num_batched_tokens: 1024}
  - name: budget-8192
    set: {engine.max_num_batched_tokens: 8192}
  - name: max-len-600
    set: {model.max_model_len: 600}
capacity:
  slo: {ttft_p99_ms: 2000, tpot_p99_ms: 60}
  lo: 1
  hi: 200
  tolerance: 0.1
EOF
expect 0 "budget-1024 +none +- +cannot_finish" -- sweep "$tmp/unfinished.yaml" --out "$tmp/unf" -j 2
python3 - "$tmp/unf/capacity.csv" "$tmp/unf/results.csv" <<'PY' && ok || fail "capacity counts unfinished requests"
import csv, sys
rows = {r["name"]: r for r in csv.DictReader(open(sys.argv[1]))}
for name in ("budget-1024", "max-len-600"):
    r = rows[name]
    print(name, r["status"], repr(r["capacity"]), r["finished_share"], r["limited_by"])
    assert r["status"] == "cannot_finish", r
    assert r["capacity"] == "", r  # no number
    assert r["requests"] == "200", r
    assert float(r["finished_share"]) < 0.99, r
    assert " of 200 requests fail at any rate (" in r["limited_by"], r
assert "prompt_over_token_budget" in rows["budget-1024"]["limited_by"]
assert "exceeds_max_model_len" in rows["max-len-600"]["limited_by"]
r = rows["budget-8192"]
print("budget-8192", r["status"], r["capacity"], r["finished_share"])
assert r["status"] == "found" and float(r["finished_share"]) == 1.0, r
# Every run that passed finished all but at most 1 % of its requests (p99 over all of them).
for run in csv.DictReader(open(sys.argv[2])):
    if run["meets_slo"] == "true":
        assert int(run["requests.finished"]) >= 0.99 * int(run["requests.total"]), run
    if run["name"] == "budget-1024":
        assert run["meets_slo"] == "false" and "over all 200 requests" in run["why"], run
PY

# Another build's results are refused (#34): a copy of tandem with one byte appended is another
# build. Its `sweep run` refuses this build's plan; its results, copied in, make collect exit 2
# naming both builds, and a local sweep runs their points again instead of reusing them.
other=$tmp/tandem-other
cp "$tandem" "$other" && printf 'x' >>"$other"
printf 'workload: %s\nrates: [10, 20]\n' "$d/fixed_step.yaml" >"$tmp/builds.yaml"
"$tandem" sweep plan "$tmp/builds.yaml" --out "$tmp/bA" >/dev/null || fail "plan with this build"
"$other" sweep plan "$tmp/builds.yaml" --out "$tmp/bB" >/dev/null || fail "plan with the other build"
build_a=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["build"])' "$tmp/bA/plan.json")
build_b=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["build"])' "$tmp/bB/plan.json")
[ -n "$build_a" ] && [ "$build_a" != "$build_b" ] && ok || fail "one byte more is not another build: $build_a vs $build_b"
out=$(timeout "$limit" "$other" sweep run "$tmp/bA" --index 0 2>&1)
rc=$?
[ $rc = 2 ] && grep -qF "planned by build $build_a, and this tandem is build $build_b" <<<"$out" && ok ||
  fail "sweep run of another build's plan: exit $rc: $out"
timeout "$limit" "$other" sweep run "$tmp/bB" --index 0 >/dev/null 2>&1 || fail "the other build runs its own plan"
mkdir -p "$tmp/bA/results" && cp "$tmp/bB/results/point-0.json" "$tmp/bA/results/"
expect 2 "1 result\(s\) of another build than the plan's \($build_a\): results/point-0.json \(point 0\) was run by build $build_b" -- sweep collect "$tmp/bA"
# A result that copied the plan's key (as sweep run did before #34) is refused for its build too.
python3 - "$tmp/bA/plan.json" "$tmp/bA/results/point-0.json" <<'PY'
import json, sys
key = json.load(open(sys.argv[1]))["points"][0]["key"]
r = json.load(open(sys.argv[2]))
r["key"] = key
json.dump(r, open(sys.argv[2], "w"))
PY
expect 2 "was run by build $build_b" -- sweep collect "$tmp/bA"
expect 0 "not reused \(this build is $build_a\): results/point-0.json \(point 0\) was run by build $build_b" -- sweep "$tmp/builds.yaml" --out "$tmp/bA"
grep -qF "\"build\": \"$build_a\"" "$tmp/bA/results/point-0.json" && ok || fail "the local sweep kept the other build's result"
# sweep run keys each point with the files as they are where it runs: a file the workload reads
# that changed since the plan gives a key the plan does not hold, and collect lists the point.
printf 'len\n4\n' >"$tmp/lens.csv"
"$tandem" sweep plan "$tmp/fsr.yaml" --out "$tmp/rekey" >/dev/null || fail "plan for the rekey check"
printf 'len\n6\n' >"$tmp/lens.csv"
expect 0 "" -- sweep run "$tmp/rekey" --index 0
expect 1 "1 results of another plan ignored|without a complete result: 0" -- sweep collect "$tmp/rekey"

# Cost (#34): each point's GPUs from its layout, priced per GPU-hour by its hardware; capacity per
# GPU and per dollar; the cheapest configuration whose capacity is at least cost.at_rate.
cat >"$tmp/cost.yaml" <<EOF
workload: $src/workloads/quickstart.yaml
set: {requests.count: 200}
configs:
  - name: one
  - name: dp2
    set: {engine.data_parallel: 2}
  - name: pcie
    set: {hardware: h200-pcie}
capacity:
  slo: {ttft_p99_ms: 2000, tpot_p99_ms: 60}
  lo: 1
  hi: 200
  tolerance: 0.1
cost:
  gpu_hour_usd: {h200: 2, h200-pcie: 1.5}
  at_rate: 60
EOF
expect 0 "^cheapest meeting the SLO at requests.arrival.rate 60: dp2 \(dp2, 2 GPUs\) at \\\$4.00/hour" -- sweep "$tmp/cost.yaml" --out "$tmp/cost" -j 2
python3 - "$tmp/cost/capacity.csv" <<'PY' && ok || fail "cost: capacity.csv's per-GPU and per-dollar figures"
import csv, sys
rows = {r["name"]: r for r in csv.DictReader(open(sys.argv[1]))}
price = {"one": 2, "dp2": 4, "pcie": 1.5}
for name, r in rows.items():
    cap, gpus = float(r["capacity"]), int(r["gpus"])
    print("cost: %s capacity %.4g, %d GPU(s), $%s/hour, %.0f requests/$" % (name, cap, gpus, r["usd_per_hour"], float(r["requests_per_usd"])))
    assert gpus == (2 if name == "dp2" else 1), r
    assert float(r["usd_per_hour"]) == price[name], r
    assert abs(float(r["capacity_per_gpu"]) - cap / gpus) < 1e-9 * cap, r
    assert abs(float(r["requests_per_usd"]) - cap * 3600 / price[name]) < 1e-6 * cap * 3600, r
# The answer is the cheapest of those whose capacity is at least 60: these two alone miss it.
assert float(rows["one"]["capacity"]) < 60 and float(rows["pcie"]["capacity"]) < 60, rows
assert float(rows["dp2"]["capacity"]) >= 60, rows["dp2"]
PY
python3 - "$tmp/cost/capacity.csv" "$tmp/cost/results.csv" <<'PY' && ok || fail "cost: mfu_at_capacity is not the MFU of the run at the capacity"
import csv, sys
runs = list(csv.DictReader(open(sys.argv[2])))
for r in csv.DictReader(open(sys.argv[1])):
    at = [x for x in runs if x["name"] == r["name"] and x["rate"] == r["capacity"]]
    assert len(at) == 1 and r["mfu_at_capacity"] == at[0]["utilisation.mfu"], (r, at)
    assert 0 < float(r["mfu_at_capacity"]) < 1, r
    print("cost: %s MFU at capacity %.4f" % (r["name"], float(r["mfu_at_capacity"])))
PY
# 1P1D's P and D sizes as grid axes (#34): each point's GPUs are P's TP + D's, priced by each
# side's own hardware (P on h200-pcie here); each side's MFU over its own GPUs; vLLM's layout has
# num_gpus alone (no TP x DP product counts a 1P1D point's GPUs).
cat >"$tmp/pdsize.yaml" <<EOF
workload: $src/workloads/quickstart.yaml
set: {requests.count: 200, disaggregation.enabled: true, disaggregation.prefill.hardware: h200-pcie}
grid:
  disaggregation.prefill.tp: [1, 2]
  disaggregation.decode.tp: [1, 2]
capacity:
  slo: {ttft_p99_ms: 2000, tpot_p99_ms: 60}
  lo: 1
  hi: 200
  tolerance: 0.1
cost:
  gpu_hour_usd: {h200: 2, h200-pcie: 1.5}
EOF
expect 0 "1P1D, 4 GPUs, TTFT@P" -- sweep "$tmp/pdsize.yaml" --out "$tmp/pdsize" -j 2
python3 - "$tmp/pdsize" <<'PY' && ok || fail "1P1D sizes: GPUs, prices, MFU or vLLM records per P and D size"
import csv, glob, json, os, sys
d = sys.argv[1]
rows = list(csv.DictReader(open(os.path.join(d, "capacity.csv"))))
assert len(rows) == 4, rows
runs = list(csv.DictReader(open(os.path.join(d, "results.csv"))))
for r in rows:
    p, dd = int(r["disaggregation.prefill.tp"]), int(r["disaggregation.decode.tp"])
    assert int(r["gpus"]) == p + dd, r
    assert float(r["usd_per_hour"]) == 1.5 * p + 2 * dd, r
    assert r["status"] == "found" and 0 < float(r["mfu_at_capacity"]) < 1, r
    for x in runs:
        if x["name"] == r["name"]:
            assert x["layout"] == "1P1D, %d GPUs, TTFT@P" % (p + dd), x["layout"]
            assert float(x["utilisation.prefill_mfu"]) > 0 and float(x["utilisation.decode_mfu"]) > 0, x
    print("1P1D P tp %d + D tp %d: %s GPUs, $%s/hour, capacity %.4g, MFU at capacity %.4f"
          % (p, dd, r["gpus"], r["usd_per_hour"], float(r["capacity"]), float(r["mfu_at_capacity"])))
records = [json.load(open(f))[0] for f in glob.glob(os.path.join(d, "vllm", "*", "summary.json"))]
assert len(records) == len(runs), (len(records), len(runs))
for rec in records:
    p, dd = rec["disaggregation.prefill.tp"], rec["disaggregation.decode.tp"]
    assert rec["num_gpus"] == p + dd and "tensor_parallel_size" not in rec and "data_parallel_size" not in rec, rec
PY

# Without prices, tandem's example prices, labelled as examples; bad cost sections exit 2 naming the field.
sed -i '/gpu_hour_usd/d' "$tmp/cost.yaml"
expect 0 "tandem's example prices, not quotes" -- sweep "$tmp/cost.yaml" --out "$tmp/cost-ex" -j 2
printf 'workload: %s\nrates: [10]\ncost: {at_rate: 5}\n' "$d/fixed_step.yaml" >"$tmp/cost-rates.yaml"
expect 2 "cost-rates.yaml:3:7: field 'cost': needs a capacity search" -- sweep "$tmp/cost-rates.yaml" --out "$tmp/x"
printf 'workload: %s\ncapacity: {slo: {ttft_p99_ms: 2}, lo: 1, hi: 2}\ncost: {gpu_hour_usd: {h200: -1}}\n' "$d/fixed_step.yaml" >"$tmp/cost-neg.yaml"
expect 2 "cost-neg.yaml:3:29: field 'cost.gpu_hour_usd.h200': .*out of range" -- sweep "$tmp/cost-neg.yaml" --out "$tmp/x"
printf 'workload: %s\ncapacity: {slo: {ttft_p99_ms: 2}, lo: 1, hi: 2}\ncost: {gpu_hour_usd: {h100: 2}}\n' "$d/fixed_step.yaml" >"$tmp/cost-none.yaml"
expect 2 "field 'cost.gpu_hour_usd': no price for its hardware 'fixed-1ms' \(priced: h100 2\)" -- sweep "$tmp/cost-none.yaml" --out "$tmp/x"

echo "sweep: $passes passed, $fails failed"
[ "$fails" = 0 ]
