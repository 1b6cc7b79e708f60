#!/usr/bin/env bash
# Command-line contract: exit status 0 ok, 2 bad input (file:line:column and the field),
# and the files a run writes. Usage: cli_test.sh TANDEM_BINARY SOURCE_DIR [cuda|nocuda]
set -u
tandem=$1
src=$2
cuda_build=${3:-nocuda}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
passes=0

# expect STATUS PATTERN -- ARGS...: run tandem, check exit status and that stderr+stdout match PATTERN.
expect() {
  local want=$1 pattern=$2
  shift 3
  local out rc
  out=$("$tandem" "$@" 2>&1)
  rc=$?
  if [ "$rc" != "$want" ] || ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL: tandem $* -> exit $rc (want $want), output:"
    echo "$out" | head -5 | sed 's/^/    /'
    echo "    (wanted /$pattern/)"
    fails=$((fails + 1))
  else
    passes=$((passes + 1))
  fi
}

bad=$src/tests/data/bad
expect 2 "unknown_key.yaml:5:3: field 'engine.max_batched_tokens': unknown field" -- run "$bad/unknown_key.yaml"
expect 2 "wrong_type.yaml:4:10: field 'requests.count': expected an integer, got 'four'" -- run "$bad/wrong_type.yaml"
expect 2 "syntax.yaml:[0-9]+:[0-9]+: invalid YAML" -- validate "$bad/syntax.yaml"
expect 2 "bad_azure.csv:3: column 'ContextTokens': expected a number, got 'abc'" -- run "$bad/bad_trace_row.yaml"
expect 2 "negative_rate.yaml:5:37: field 'requests.arrival.rate'" -- run "$bad/negative_rate.yaml"
expect 2 "field 'model': missing" -- run "$bad/empty.yaml"
expect 2 "nope.yaml: cannot open file" -- run "$tmp/nope.yaml"
expect 2 "not a regular file" -- run "$tmp"
expect 2 "--set engine.max_num_seq=4: field 'engine.max_num_seq': unknown field" -- run "$src/workloads/quickstart.yaml" --set engine.max_num_seq=4
expect 2 "expected KEY=VALUE" -- run "$src/workloads/quickstart.yaml" --set engine.max_num_seqs
expect 2 "CPU backend's KV cache would take .* set engine.num_kv_blocks" -- run "$src/workloads/quickstart.yaml" --backend cpu
# --backend cuda: a build without the CUDA feature says so (exit 2); a CUDA build on a
# machine without a GPU fails at run time (exit 1). On a GPU machine this is not checked.
if [ "$cuda_build" = nocuda ]; then
  expect 2 "--backend cuda: this build has no CUDA backend" -- run "$src/workloads/cpu_tiny.yaml" --backend cuda
elif ! nvidia-smi -L >/dev/null 2>&1; then
  expect 1 "--backend cuda: no usable CUDA device" -- run "$src/workloads/cpu_tiny.yaml" --backend cuda
fi
expect 2 "calibrate --backend tpu: not available in this build \\(known: cpu" -- calibrate --backend tpu --workload "$src/workloads/cpu_tiny.yaml" --out "$tmp/p.yaml"
if [ "$cuda_build" = cuda ]; then
  expect 2 "calibrate --backend cuda: give --workload \\(grid mode is CPU-only\\)" -- calibrate --backend cuda --out "$tmp/p.yaml"
fi
expect 2 "field 'engine.cuda_attention': unknown attention kernel 'flash' \\(known: simt, mma\\)" -- validate "$src/workloads/cpu_tiny.yaml" --set engine.cuda_attention=flash
expect 2 "field 'engine.cuda_graph': expected true or false" -- validate "$src/workloads/cpu_tiny.yaml" --set engine.cuda_graph=sometimes
expect 2 "--clock wall needs a real backend" -- run "$src/workloads/quickstart.yaml" --clock wall
expect 2 "unknown command 'frobnicate'" -- frobnicate
expect 2 "unrecognised option|unrecognized option" -- run "$src/workloads/quickstart.yaml" --bogus
expect 2 "cannot open" -- compare "$tmp/none_a" "$tmp/none_b"

# Found by adversarial testing: each must be refused with the field, not crash or mislead.
q=$src/workloads/quickstart.yaml
expect 2 "beyond the simulator's time range" -- validate "$q" --set 'requests.arrival={process: constant, rate: 1e-9}'
expect 2 "--threads must be in" -- run "$src/workloads/golden_small.yaml" --backend cpu --threads 100000
expect 2 "field 'engine.max_num_seqs': empty" -- run "$q" --set engine.max_num_seqs=
expect 2 "field 'requests.prompt_len.path': /dev/zero: not a regular file" -- run "$q" --set 'requests.prompt_len={dist: empirical, path: /dev/zero}'
expect 2 "at most 134217728 are supported" -- run "$q" --set engine.num_kv_blocks=2147483647
printf 'model: tiny\nmodel: tiny\n' >"$tmp/dup.yaml"
expect 2 "dup.yaml:2:1: field 'model': given twice" -- run "$tmp/dup.yaml"
printf 'arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,396,109\n0.0,374,44\n' >"$tmp/unsorted.csv"
expect 0 "requests 2: finished 2" -- run "$q" --set "requests={trace: {format: vidur, path: $tmp/unsorted.csv}}"
mkdir -p "$tmp/arr" && echo '[1]' >"$tmp/arr/summary.json"
expect 2 "expected a JSON object" -- compare "$tmp/arr" "$tmp/arr"

# A run writes the contract files.
expect 0 "TTFT ms" -- run "$src/workloads/quickstart.yaml" --set requests.count=50 --out "$tmp/a"
expect 0 "" -- run "$src/workloads/quickstart.yaml" --set requests.count=50 --set engine.policy=static --out "$tmp/b" --quiet
for f in summary.json requests.csv steps.csv trace.json; do
  if [ ! -s "$tmp/a/$f" ]; then echo "FAIL: $f missing"; fails=$((fails + 1)); else passes=$((passes + 1)); fi
done
if head -1 "$tmp/a/requests.csv" | grep -q '^id,arrival_s,first_token_s,finish_s,prompt_len,output_len,status,.*,output_tokens$'; then
  passes=$((passes + 1))
else
  echo "FAIL: requests.csv header"; fails=$((fails + 1))
fi
rows=$(($(wc -l <"$tmp/a/requests.csv") - 1))
if [ "$rows" = 50 ]; then passes=$((passes + 1)); else echo "FAIL: requests.csv has $rows rows, want 50"; fails=$((fails + 1)); fi
for key in ttft_ms tpot_ms itl_ms e2e_ms throughput requests prefix_cache backend wall_s sim_s; do
  if grep -q "\"$key\"" "$tmp/a/summary.json"; then passes=$((passes + 1)); else echo "FAIL: summary.json lacks $key"; fails=$((fails + 1)); fi
done
expect 0 "ttft_ms.p99 .*%" -- compare "$tmp/a" "$tmp/b"
# check NAME COMMAND...: one pass or fail by the command's exit status.
check() {
  local name=$1
  shift
  if "$@"; then passes=$((passes + 1)); else echo "FAIL: $name"; fails=$((fails + 1)); fi
}
# --trace: trace.json's detail (default full); the CSV files do not depend on it.
if command -v python3 >/dev/null; then
  check "trace.json is valid JSON" python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$tmp/a/trace.json"
fi
check "default trace has step slices with args and request spans" \
  grep -q '"ph":"X".*"args":{"seqs":.*"cat":"request"' <(tr -d '\n' <"$tmp/a/trace.json")
expect 2 "--trace verbose: expected none, requests, steps or full" -- run "$q" --trace verbose
expect 0 "" -- run "$q" --set requests.count=50 --out "$tmp/t" --trace requests --quiet
check "--trace requests: request spans and counters, no step slices" \
  bash -c "grep -q '\"cat\":\"request\"' '$tmp/t/trace.json' && grep -q '\"ph\":\"C\"' '$tmp/t/trace.json' && ! grep -q '\"ph\":\"X\"' '$tmp/t/trace.json'"
expect 0 "" -- run "$q" --set requests.count=50 --out "$tmp/t" --trace none --quiet
check "--trace none: no trace.json (an earlier one removed)" test ! -e "$tmp/t/trace.json"
check "steps.csv and requests.csv do not depend on --trace" \
  bash -c "cmp -s '$tmp/a/steps.csv' '$tmp/t/steps.csv' && cmp -s '$tmp/a/requests.csv' '$tmp/t/requests.csv'"
# The CPU backend writes each request's output token ids.
expect 0 "backend cpu" -- run "$src/workloads/golden_small.yaml" --backend cpu --clock virtual --set requests.count=6 --out "$tmp/cpu"
if awk -F, 'NR>1 && $7=="finished" { n=split($16, t, " "); if (n != $6) bad=1 } END { exit bad }' "$tmp/cpu/requests.csv" &&
   [ "$(awk -F, 'NR>1 && $16!=""' "$tmp/cpu/requests.csv" | wc -l)" = 6 ]; then
  passes=$((passes + 1))
else
  echo "FAIL: cpu requests.csv lacks output tokens"; fails=$((fails + 1))
fi
expect 2 "generate: --prompt: 'x' is not a token id" -- generate --model tiny --prompt "1 x 3"
expect 0 "^[0-9]+ [0-9]+ [0-9]+$" -- generate --model tiny --prompt "1 2 3" --max-tokens 3
expect 0 "max_num_seqs: 8" -- validate "$src/workloads/quickstart.yaml" --set engine.max_num_seqs=8
# validate's output is itself a valid workload (round trip).
"$tandem" validate "$src/workloads/mixed_long_short.yaml" >"$tmp/resolved.yaml" 2>&1
expect 0 "policy: continuous" -- validate "$tmp/resolved.yaml"

echo "$passes passed, $fails failed"
[ "$fails" = 0 ]
