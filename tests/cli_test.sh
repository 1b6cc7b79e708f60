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

# A case's time limit: 60 s on a plain build, times a scale for an instrumented one (ASan +
# UBSan run the same commands 3-10x slower, more on a slow machine). TANDEM_TEST_TIME_SCALE
# overrides the scale; without it an ASan build is detected from its linked runtime. A hang
# still fails, within limit seconds.
scale=${TANDEM_TEST_TIME_SCALE:-}
if [ -z "$scale" ]; then
  scale=1
  if ldd "$tandem" 2>/dev/null | grep -q libasan; then scale=5; fi
fi
limit=$((60 * scale))
times=$tmp/case-times.txt  # seconds and command of every case, for the slowest-ten listing

# expect STATUS PATTERN -- ARGS...: run tandem, check exit status and that stderr+stdout match PATTERN.
expect() {
  local want=$1 pattern=$2
  shift 3
  local out rc t0=$EPOCHREALTIME
  out=$(timeout "$limit" "$tandem" "$@" 2>&1)  # a hang is a failure (exit 124), not a stuck suite
  rc=$?
  local cmd=$*
  printf '%s  %s\n' "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%8.2f", b - a }')" "${cmd//$'\n'/\\n}" >>"$times"
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
  expect 2 "calibrate: give --model PRESET \\(per-operator profile\\) or --workload" -- calibrate --backend cuda --out "$tmp/p.yaml"
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
if awk -F, 'NR>1 && $7=="finished" { n=split($17, t, " "); if (n != $6) bad=1 } END { exit bad }' "$tmp/cpu/requests.csv" &&
   [ "$(awk -F, 'NR>1 && $17!=""' "$tmp/cpu/requests.csv" | wc -l)" = 6 ]; then
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

# Issue #11 (held-out adversarial findings): each class refused where the input is read.
# expect_t: expect (which runs every case under the time limit: a regression here would hang
# or grow without bound); the name marks the cases that need the limit.
expect_t() { expect "$@"; }
# make_ckpt DIR MAX_POS HIDDEN HEADS: a one-layer Llama checkpoint (vocab 4, ffn 2, tied
# embeddings, zero weights) written with printf: config.json and model.safetensors.
make_ckpt() {
  local dir=$1 maxpos=$2 h=$3 heads=$4 f=2 V=4 hdr='{' off=0 sep='' spec name shape n
  mkdir -p "$dir"
  printf '{"hidden_size": %d, "intermediate_size": %d, "num_hidden_layers": 1, "num_attention_heads": %d, "vocab_size": %d, "max_position_embeddings": %d, "tie_word_embeddings": true}\n' \
    "$h" "$f" "$heads" "$V" "$maxpos" >"$dir/config.json"
  for spec in "model.embed_tokens.weight:$V,$h:$((V * h))" "model.layers.0.input_layernorm.weight:$h:$h" \
      "model.layers.0.post_attention_layernorm.weight:$h:$h" "model.layers.0.self_attn.q_proj.weight:$h,$h:$((h * h))" \
      "model.layers.0.self_attn.k_proj.weight:$h,$h:$((h * h))" "model.layers.0.self_attn.v_proj.weight:$h,$h:$((h * h))" \
      "model.layers.0.self_attn.o_proj.weight:$h,$h:$((h * h))" "model.layers.0.mlp.gate_proj.weight:$f,$h:$((f * h))" \
      "model.layers.0.mlp.up_proj.weight:$f,$h:$((f * h))" "model.layers.0.mlp.down_proj.weight:$h,$f:$((h * f))" \
      "model.norm.weight:$h:$h"; do
    IFS=: read -r name shape n <<<"$spec"
    hdr+="$sep\"$name\":{\"dtype\":\"F32\",\"shape\":[$shape],\"data_offsets\":[$off,$((off + 4 * n))]}"
    off=$((off + 4 * n))
    sep=','
  done
  hdr+='}'
  local len=${#hdr} i bytes=''
  for i in 0 1 2 3 4 5 6 7; do bytes+=$(printf '\\x%02x' $(((len >> (8 * i)) & 255))); done
  { printf "$bytes"; printf '%s' "$hdr"; head -c "$off" /dev/zero; } >"$dir/model.safetensors"
}
i11=$tmp/issue11
mkdir -p "$i11"
printf 'model: {checkpoint: ck}\nhardware: h200\nengine: {num_kv_blocks: 64}\nrequests: {count: 3, arrival: {process: burst}, prompt_len: 5, output_len: 3}\n' >"$i11/ck.yaml"
# 1. The simulated clock must not wrap: a step or a time past its range stops the run.
expect 1 "past the simulator's time range .*mem_bandwidth_tbs 1e-09" -- run "$q" --set requests.count=2000 \
  --set 'hardware={preset: h200, mem_bandwidth_tbs: 1e-9, peak_tflops: 1e-6}'
printf 'fitted: {backend: cpu, model: llama3-8b, overhead_us: 1e12, per_token_us: 1e12, per_seq_us: 0, per_attn_pair_ns: 0, per_context_token_ns: 0, per_sample_us: 0}\nmemory_gb: 100\n' >"$i11/slow.yaml"
expect 1 "the cost model charges .* steps of at most 1e\+09 s.*per_token_us 1e\+12" -- run "$q" --set hardware="$i11/slow.yaml"
# 2. A checkpoint's config.json (or shard) that is not a regular file: refused, not read forever.
make_ckpt "$i11/ck" 64 4 2
cp -r "$i11/ck" "$i11/ckz" && rm "$i11/ckz/config.json" && ln -s /dev/zero "$i11/ckz/config.json"
expect_t 2 "ckz/config.json: not a regular file" -- generate --checkpoint "$i11/ckz" --prompt "1 2"
sed 's/checkpoint: ck}/checkpoint: ckz}/' "$i11/ck.yaml" >"$i11/ckz.yaml"
expect_t 2 "ckz.yaml:1:21: field 'model.checkpoint': .*config.json: not a regular file" -- run "$i11/ckz.yaml" --backend cpu --clock virtual
if mkfifo "$i11/fifo.json" 2>/dev/null; then
  cp -r "$i11/ck" "$i11/ckf" && rm "$i11/ckf/config.json" && mv "$i11/fifo.json" "$i11/ckf/config.json"
  expect_t 2 "ckf/config.json: not a regular file" -- generate --checkpoint "$i11/ckf" --prompt "1 2"
fi
# 3. A huge accepted context length: tables sized by what can run (the KV cache), no bad_alloc.
make_ckpt "$i11/ckbig" 2147483647 64 1
expect_t 0 "^[0-9]+ [0-9]+$" -- generate --checkpoint "$i11/ckbig" --prompt "1 2 3" --max-tokens 2
expect_t 0 "finished 3" -- run "$i11/ck.yaml" --backend cpu --clock virtual --set 'model={preset: tiny, max_model_len: 2147483647}'
# 4. A number out of range in a Mooncake row: bad input with its line.
printf '{"timestamp":0,"input_length":10,"output_length":5}\n{"timestamp":1e999,"input_length":10,"output_length":5}\n' >"$i11/big.jsonl"
expect 2 "big.jsonl:2: invalid JSON: .*number overflow" -- validate "$q" --set "requests={trace: {format: mooncake, path: $i11/big.jsonl}}"
# 5. An empty string is not the integer 0.
expect 2 "field 'seed': expected an integer, got ''" -- validate "$q" --set "seed=''"
expect 2 "field 'requests.cancel.at\[0\].request': expected an integer, got ''" -- validate "$q" --set "requests.cancel={at: [{request: '', at_s: 1}]}"
expect 2 "field 'requests.trace.limit': expected an integer, got ''" -- validate "$q" \
  --set "requests={trace: {format: vidur, path: $src/traces/vidur_sample.csv, limit: ''}}"
expect 2 "field 'name': an empty string" -- validate "$q" --set "name=''"
# 6. Silently accepted before, refused now.
printf 'model: tiny\nhardware: h200\nrequests: {count: 2, arrival: {process: burst}, prompt_len: 4, output_len: 2}\n---\nseed: 5\n' >"$i11/two.yaml"
expect 2 "two.yaml:4:1: a second YAML document" -- validate "$i11/two.yaml"
expect 2 "the value holds more than one YAML document" -- validate "$q" --set $'engine.max_num_seqs=4\n---\n5'
# yaml-cpp's LoadAll loops forever on a lone ',' (found by the workload and profile fuzzers):
# one document is read without it, in a workload, a --set value and a profile.
printf ',' >"$i11/comma.yaml"
expect 2 "field 'model': missing" -- validate "$i11/comma.yaml"
expect 2 "field 'seed'" -- validate "$q" --set 'seed=,'
expect 2 "comma.yaml" -- validate "$q" --set "hardware=$i11/comma.yaml"
expect 2 "field 'engine.max_num_seqs': YAML tags are not supported \(remove '!!str'\)" -- validate "$q" --set 'engine.max_num_seqs=!!str 50'
expect 2 "field 'engine.max_num_seqs': YAML tags are not supported \(remove '!foo'\)" -- validate "$q" --set 'engine.max_num_seqs=!foo 50'
printf 'model: tiny\nhardware: h200\nengine:\nrequests: {count: 2, arrival: {process: burst}, prompt_len: 4, output_len: 2}\n' >"$i11/engine_empty.yaml"
expect 2 "engine_empty.yaml:4:1: field 'engine': empty" -- validate "$i11/engine_empty.yaml"
expect 2 "field 'slo': empty" -- validate "$q" --set slo=
expect 2 "validate: --out is an option of run" -- validate "$q" --out "$i11/v"
expect 2 "validate: --backend is an option of run" -- validate "$q" --backend sim
expect 2 "--trace: .*needs --out" -- run "$q" --trace none
expect 2 "--threads: only the CPU backend" -- run "$q" --threads 2
expect 2 "generate: --seed: '-1' is not an integer" -- generate --model tiny --prompt "1 2" --seed -1
expect 2 "generate: --seed sets dummy weights" -- generate --checkpoint "$i11/ck" --prompt "1 2" --seed 3
expect 2 "calibrate: --reps applies to the grid \\(--model\\)" -- calibrate --workload "$src/workloads/cpu_tiny.yaml" --reps 3 --out "$i11/p.yaml"
mkdir -p "$i11/nometrics" "$i11/wrongtype"
echo '{"backend": "sim", "policy": "static"}' >"$i11/nometrics/summary.json"
expect 2 "nometrics/summary.json: field 'ttft_ms.mean': missing" -- compare "$tmp/a" "$i11/nometrics"
sed 's/"steps": [0-9]*/"steps": "many"/' "$tmp/a/summary.json" >"$i11/wrongtype/summary.json"
expect 2 "wrongtype/summary.json: field 'steps': expected a number, got \"many\"" -- compare "$i11/wrongtype" "$tmp/a"
make_ckpt "$i11/ck3" 64 10 4
sed 's/checkpoint: ck}/checkpoint: ck3}/' "$i11/ck.yaml" >"$i11/ck3.yaml"
expect 2 "field 'model.checkpoint': .*num_attention_heads \(4\) must divide hidden_size \(10\)" -- validate "$i11/ck3.yaml"
expect 2 "num_attention_heads \(4\) must divide hidden_size \(10\)" -- run "$i11/ck3.yaml"
make_ckpt "$i11/ckodd" 64 6 2
expect 2 "ckodd/config.json: the head dim .* must be even" -- generate --checkpoint "$i11/ckodd" --prompt "1 2"
expect 2 "field 'model.heads': the head dim hidden / heads = 24 / 8 = 3 must be even" -- validate "$q" --set 'model={preset: tiny, hidden: 24}'
cp -r "$i11/ck" "$i11/cktrail" && printf 'xxxx' >>"$i11/cktrail/model.safetensors"
expect 2 "4 bytes after the last tensor's data" -- generate --checkpoint "$i11/cktrail" --prompt "1 2"
printf '{"timestamp":0,"input_length":600,"output_length":5,"hash_ids":[1,2,3]}\n' >"$i11/hash.jsonl"
expect 2 "hash.jsonl:1: field 'hash_ids': 3 ids, but input_length 600 spans only 2 block" -- validate "$q" --set "requests={trace: {format: mooncake, path: $i11/hash.jsonl}}"
printf '{"timestamp":0,"input_length":10,"output_length":5,"input_length":20}\n' >"$i11/dupkey.jsonl"
expect 2 "dupkey.jsonl:1: field 'input_length': given twice" -- validate "$q" --set "requests={trace: {format: mooncake, path: $i11/dupkey.jsonl}}"
printf 'arrived_at,num_prefill_tokens,num_decode_tokens,num_prefill_tokens\n0,1,1,5\n' >"$i11/dupcol.csv"
expect 2 "dupcol.csv:1: column 'num_prefill_tokens' appears twice" -- validate "$q" --set "requests={trace: {format: vidur, path: $i11/dupcol.csv}}"
# ... and found on the way: an alias inside its own anchor made the mixture parser loop forever,
# and aliases of aliases ("billion laughs") expand a small file without bound.
expect_t 2 "nested too deeply" -- validate "$q" \
  --set 'requests.prompt_len={dist: mixture, components: [&y {weight: 1, dist: mixture, components: [*y]}]}'
{ echo 'l0: &l0 [1, 1, 1, 1, 1, 1, 1, 1, 1]'; for i in 1 2 3 4 5 6 7 8 9; do
  echo "l$i: &l$i [*l$((i - 1)), *l$((i - 1)), *l$((i - 1)), *l$((i - 1)), *l$((i - 1)), *l$((i - 1)), *l$((i - 1)), *l$((i - 1)), *l$((i - 1))]"
done; } >"$i11/laughs.yaml"
expect_t 2 "aliases \('\*name'\) expand it too far" -- validate "$i11/laughs.yaml"
# 7. An Azure timestamp's seconds must be digits (sscanf alone took 'nan').
printf 'TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,10,5\n2023-11-16 18:15:nan,10,5\n' >"$i11/nan.csv"
expect 2 "nan.csv:3: column 'TIMESTAMP': expected 'YYYY-MM-DD HH:MM:SS.fff', got '2023-11-16 18:15:nan'" -- validate "$q" \
  --set "requests={trace: {format: azure, path: $i11/nan.csv}}"
# 8. summary.json's peak RSS is the process's peak (taken after the outputs are written).
# Not under AddressSanitizer: its quarantine (freed memory is not reused) and its leak scan at
# exit grow the process after tandem's last measurement, by an amount unrelated to tandem.
if [ -x /usr/bin/time ] && ! ldd "$tandem" 2>/dev/null | grep -q libasan; then
  /usr/bin/time -o "$i11/time.txt" -f '%M' "$tandem" run "$q" --set requests.count=20000 --out "$i11/rss" --quiet >/dev/null 2>&1
  rss_kb=$(sed -n 's/.*"peak_rss_mb": *\([0-9.]*\).*/\1/p' "$i11/rss/summary.json" | awk '{printf "%d", $1 * 1024}')
  check "summary.json peak_rss_mb ($rss_kb kB) within 4 MB of the process's peak ($(tail -1 "$i11/time.txt") kB)" \
    test "$((rss_kb + 4096))" -ge "$(tail -1 "$i11/time.txt")"
fi

# Stage 3: prefix caching. Its knobs are checked, its summary line and requests.csv column
# are written, and a shared-prefix workload actually hits.
expect 2 "field 'engine.enable_prefix_caching': expected true or false" -- validate "$q" --set engine.enable_prefix_caching=maybe
expect 2 "field 'engine.block_size'" -- validate "$q" --set engine.block_size=0
expect 2 "field 'requests.shared_prefix.prepend'" -- validate "$q" --set 'requests.shared_prefix={groups: 2, prefix_len: 64, prepend: 3}'
expect 0 "prefix cache: off" -- run "$q" --set requests.count=20 --set engine.enable_prefix_caching=false
expect 0 "prefix cache: hit rate [1-9][0-9.]*% of prompt tokens" -- run "$src/workloads/stage3_shared_prefix.yaml" \
  --set requests.count=200 --out "$tmp/s3"
check "requests.csv has cached_tokens, and some request took > 1000 tokens from the cache" \
  bash -c "head -1 '$tmp/s3/requests.csv' | grep -q ',prefix_group,cached_tokens,output_tokens\$' &&
           awk -F, 'NR>1 && \$16 > 1000 { n++ } END { exit n > 0 ? 0 : 1 }' '$tmp/s3/requests.csv'"
check "summary.json has the prefix cache's hit rate by tokens and blocks, hits and evictions" \
  bash -c "grep -q '\"block_hit_rate\"' '$tmp/s3/summary.json' && grep -q '\"evictions\"' '$tmp/s3/summary.json'"

# 9. The per-operator profile (issue #12): a quick grid on the CPU backend, a simulated run
# priced by it (steps.csv: the prediction beside the step), and a bad profile refused naming
# the file, line and field.
p12=$tmp/p12
mkdir -p "$p12"
expect 0 "profile written to .*p12/tiny.yaml" -- calibrate --backend cpu --model tiny --quick --reps 1 --budget 20 \
  --threads 1 --out "$p12/tiny.yaml"
expect 0 "" -- run "$src/workloads/cpu_tiny.yaml" --set hardware="$p12/tiny.yaml" --out "$p12/sim" --quiet
check "steps.csv carries predicted_ms and pred_error" grep -q ',predicted_ms,pred_error$' "$p12/sim/steps.csv"
expect 0 "predicted step times \\(ms\\), profiled" -- validate "$src/workloads/cpu_tiny.yaml" --set hardware="$p12/tiny.yaml"
sed 's/ms: \([0-9]\)/ms: x\1/' "$p12/tiny.yaml" >"$p12/bad.yaml"
expect 2 "bad.yaml:[0-9]+:[0-9]+: field 'hardware.profiled.raw\\[0\\].ms': expected a number" -- \
  validate "$src/workloads/cpu_tiny.yaml" --set hardware="$p12/bad.yaml"
expect 2 "calibrate: --budget 0: must be in" -- calibrate --model tiny --budget 0 --out "$p12/x.yaml"

# Issue #25: what a new user trips over. Each case failed before its change.
i25=$tmp/issue25
tandem_abs=$(realpath "$tandem")
mkdir -p "$i25/w" "$i25/a/b" "$i25/c"
cp "$src/traces/vidur_sample.csv" "$src/traces/lengths_sample.csv" "$i25/w/"
printf 'model: llama3-8b\nhardware: h200\nrequests: {trace: {format: vidur, path: vidur_sample.csv}}\n' >"$i25/w/trace.yaml"
printf 'model: llama3-8b\nhardware: h200\nrequests: {count: 30, arrival: {process: poisson, rate: 5}, prompt_len: {dist: empirical, path: lengths_sample.csv, column: num_prefill_tokens}, output_len: {dist: empirical, path: lengths_sample.csv, column: num_decode_tokens}}\n' >"$i25/w/lengths.yaml"
# 1. A run folder's workload.resolved.yaml runs again from another directory, to the byte.
for wl in trace lengths; do
  check "$wl: workload.resolved.yaml re-runs from another directory with identical requests.csv and steps.csv" \
    bash -c "cd '$i25/a/b' && '$tandem_abs' run ../../w/$wl.yaml --out '$i25/$wl-1' --quiet --trace none &&
             cd '$i25/c' && '$tandem_abs' run '$i25/$wl-1/workload.resolved.yaml' --out '$i25/$wl-2' --quiet --trace none &&
             cmp -s '$i25/$wl-1/requests.csv' '$i25/$wl-2/requests.csv' && cmp -s '$i25/$wl-1/steps.csv' '$i25/$wl-2/steps.csv'"
done
# 2. One rule for relative paths: a file's from its folder, a --set value's from the current
# directory; a missing one says where it was looked for.
expect 2 "hardware profile: nope/x.yaml: cannot open file .*looked for .*/nope/x.yaml: a relative path in a --set value is taken from the current directory" -- \
  validate "$q" --set hardware=nope/x.yaml
printf 'model: llama3-8b\nhardware: h200\nrequests: {trace: {format: vidur, path: missing.csv}}\n' >"$i25/w/missing.yaml"
expect 2 "missing.yaml:3:.*field 'requests.trace.path': .*missing.csv: cannot open file .*looked for $i25/w/missing.csv: a relative path is taken from the folder of" -- \
  validate "$i25/w/missing.yaml"
# 3. Every subcommand's --help exits 0 with its own options; --quiet without --out says so.
expect 0 "usage: tandem run WORKLOAD.yaml.*" -- run --help
expect 0 "--backend arg" -- run --help
expect 0 "usage: tandem validate WORKLOAD.yaml" -- validate --help
expect 0 "usage: tandem calibrate" -- calibrate --help
expect 0 "--budget arg" -- calibrate -h
expect 0 "usage: tandem generate" -- generate --help
expect 0 "usage: tandem compare RUN_DIR_A RUN_DIR_B" -- compare --help
expect 0 "--quiet without --out: the run's results are neither printed nor written" -- run "$q" --set requests.count=5 --quiet
# 4. compare says when its runs are different workloads, or finished different requests, and
# then compares the requests both finished.
expect 0 "" -- run "$src/workloads/stage2_long_prompts.yaml" --set requests.count=200 --set engine.enable_chunked_prefill=false --out "$i25/nochunk" --quiet --trace none
expect 0 "" -- run "$src/workloads/stage2_long_prompts.yaml" --set requests.count=200 --out "$i25/chunk" --quiet --trace none
expect 0 "note: A finished [0-9]+ requests \([1-9][0-9]* failed\), B finished 200 \(0 failed\)" -- compare "$i25/nochunk" "$i25/chunk"
expect 0 "^over the [0-9]+ requests both finished:" -- compare "$i25/nochunk" "$i25/chunk"
expect 0 "^common.ttft_ms.p99 " -- compare "$i25/nochunk" "$i25/chunk"
expect 0 "note: different workloads: A is 'quickstart', B is 'stage2_long_prompts'" -- compare "$tmp/a" "$i25/chunk"

# Issue #20: the run path. Requests that can never run are refused or failed before any
# per-token work; memory follows the blocks used; per-sequence state refuses prefix hits.
expect 2 "field 'requests.prompt_len': every request would fail at arrival: prompts of at least 2147483647 tokens and outputs of at least 4 exceed model.max_model_len \\(8192\\)" -- \
  run "$q" --set requests.prompt_len=1e300 --set requests.count=20
expect 2 "field 'requests.prompt_len': every request would fail at arrival: .* exceed the KV cache" -- \
  run "$q" --set 'model={preset: tiny, max_model_len: 2147483647}' --set requests.prompt_len=2000000000 --set requests.output_len=1
expect_t 0 "failed [0-9]+ \\[exceeds_kv_capacity [0-9]+\\]" -- run "$q" --set 'model={preset: llama3-8b, max_model_len: 2147483647}' --set requests.count=40 \
  --set 'requests.prompt_len={dist: mixture, components: [{weight: 1, dist: fixed, value: 200000000}, {weight: 1, dist: lognormal, median: 500, sigma: 0.5, min: 16, max: 4000}]}'
if ! ldd "$tandem" 2>/dev/null | grep -q libasan; then  # ASan reserves terabytes of address space
  check "134M blocks of 1 token run in 4 GB of address space (the pool's records follow the blocks used)" \
    bash -c "ulimit -v 4000000; '$tandem' run '$q' --set model=tiny --set engine.block_size=1 --set engine.num_kv_blocks=134217728 \
             --set requests.count=200 --out '$tmp/i20-blocks' --quiet --trace none"
fi
expect 2 "field 'engine.enable_prefix_caching': a model with per-sequence state \\(engine.state_slots\\) cannot take prefix hits" -- \
  validate "$q" --set 'engine={state_slots: 4, enable_prefix_caching: true}'
expect 0 "prefix cache: off \\(the model has per-sequence state" -- run "$q" --set engine.state_slots=4 --set requests.count=20
expect 0 "# prefix caching off: the model has per-sequence state" -- validate "$q" --set engine.state_slots=4
expect 0 "prefix bound .*% of the prompt tokens of the [0-9]+ requests the run can serve .* over all [0-9]+ requests with a prompt \\([0-9]+ fail at arrival\\)" -- \
  validate "$src/workloads/stage3_shared_prefix.yaml" --prefix-bound

echo "slowest cases (seconds; limit ${limit} s a case, scale $scale):"
sort -rn "$times" | head -${CLI_SLOWEST:-10} | cut -c1-160
echo "$passes passed, $fails failed"
[ "$fails" = 0 ]
