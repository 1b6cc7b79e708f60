#!/usr/bin/env bash
# Runs the fuzz targets (tests/fuzz/meson.build) for a bounded time each: from the seed corpus
# (tests/fuzz/corpus/TARGET, read only) plus what earlier runs in the same build folder added
# (BUILD/fuzz-work/TARGET/corpus; a fresh build folder, as in CI, starts from the seeds alone).
#
#   tests/fuzz/run.sh [-b BUILD] [-t SECONDS] [TARGET ...]     (default: build-fuzz, 60 s, all)
#
# A finding is a crash, a sanitizer report, an exception other than tandem::InputError, a hang
# (-timeout), a huge allocation (-malloc_limit_mb) or a leak. Its signature is its kind plus the
# innermost frames in the project's code. Reproducers of known findings, not fixed yet, live in
# tests/fuzz/findings/TARGET/: a finding with the signature of one of them is reported and the
# target goes on fuzzing (restarted from its corpus); a new one fails the run (exit 1) with its
# reproducer printed (libFuzzer's report, the input as hex and base64, the command to replay
# it) and kept under BUILD/fuzz-work/TARGET/. Replay one input: BUILD/tests/fuzz/fuzz_TARGET FILE.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)

build=build-fuzz
seconds=${FUZZ_SECONDS:-60}
while getopts "b:t:" o; do
  case $o in
    b) build=$OPTARG ;;
    t) seconds=$OPTARG ;;
    *) echo "usage: $0 [-b BUILD] [-t SECONDS] [TARGET ...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
all_targets=(workload azure vidur mooncake safetensors hf_config profile compare run frame sweep)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")

# One limit set for fuzzing and for replaying known findings. An execution takes milliseconds,
# so 3 s is a hang; a hang that allocates (yaml-cpp's LoadAll loop: about 300 MB/s under ASan)
# must time out well before the RSS limit, so that it keeps one signature.
limits=(-timeout=3 -rss_limit_mb=4096 -malloc_limit_mb=1024)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
for s in llvm-symbolizer-19 llvm-symbolizer; do
  if command -v $s >/dev/null; then export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-$(command -v $s)}; break; fi
done

# The targets' scratch files (each execution writes its input to one), in memory where
# possible; removed at the end even when a target died without cleaning up.
scratch=$(mktemp -d /dev/shm/tandem-fuzz-run.XXXXXX 2>/dev/null || mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export TMPDIR=$scratch

dict_of() {
  case $1 in
    azure|vidur) echo tests/fuzz/csv.dict ;;
    run|sweep) echo tests/fuzz/workload.dict ;;
    *) echo tests/fuzz/$1.dict ;;
  esac
}

# signature LOG: "kind | frame; frame; frame" (innermost first, project code only, no lines).
signature() {
  local log=$1 kind frames
  kind=$(grep -m1 -oE 'FINDING: [^:=]*' "$log" | tr -d '0-9')
  [ -n "$kind" ] || kind=$(grep -m1 -oE "terminate called after throwing an instance of '[^']*'" "$log" | sed 's/.*instance of /uncaught /')
  [ -n "$kind" ] || kind=$(grep -m1 -oE 'ERROR: AddressSanitizer: [a-z-]+' "$log" | sed 's/ERROR: //')
  [ -n "$kind" ] || kind=$(grep -m1 -oE 'ERROR: LeakSanitizer: [a-z ]+' "$log" | sed 's/ERROR: //')
  [ -n "$kind" ] || kind=$(grep -m1 -oE 'runtime error: [a-z -]+' "$log")
  [ -n "$kind" ] || kind=$(grep -m1 -oE 'ERROR: libFuzzer: [a-z -]+' "$log" | sed 's/ERROR: //; s/ *$//')
  [ -n "$kind" ] || { grep -q '^ALARM: working on the last Unit' "$log" && kind="libFuzzer: timeout after"; }
  [ -n "$kind" ] || kind="unknown"
  frames=$(grep -E '^ *#[0-9]+ 0x[0-9a-f]+ in ' "$log" |
           grep -E '(^|[ /])(sim|backend|policies|tests/fuzz)/[A-Za-z0-9_./-]+\.(cpp|h):[0-9]+' |
           sed -E 's/^ *#[0-9]+ 0x[0-9a-f]+ in //; s/\(anonymous namespace\)/anon/g; s/\(.*//; s/ .*//' |
           awk '!seen[$0]++' | head -3 | paste -sd';' | sed 's/;/; /g')
  echo "$kind | ${frames:-no project frame}"
}

# watched LOG DEADLINE CMD...: CMD with its output in LOG. libFuzzer's timeout report
# allocates inside a signal handler: when the alarm lands inside the allocator (a hang that
# allocates), the report deadlocks. A run still alive 15 s after its "ALARM:" line, or at
# DEADLINE (seconds since 1970), is killed (status 137); its input is lost.
alive() { local s; s=$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) && [ "$s" != Z ]; }
watched() {
  local log=$1 deadline=$2 pid alarm_at=0 now
  shift 2
  "$@" >"$log" 2>&1 &
  pid=$!
  while alive $pid; do
    sleep 1
    now=$(date +%s)
    [ $alarm_at != 0 ] || ! grep -q '^ALARM: working on the last Unit' "$log" || alarm_at=$now
    if { [ $alarm_at != 0 ] && [ $((now - alarm_at)) -ge 15 ]; } || [ $now -ge $deadline ]; then
      kill -KILL $pid 2>/dev/null
      echo "run.sh: killed: $([ $alarm_at != 0 ] && echo 'its timeout report deadlocked' || echo 'past its deadline')" >>"$log"
      break
    fi
  done
  wait $pid
}
deadlocked() { grep -q '^run.sh: killed: its timeout report deadlocked' "$1"; }

fail=0
declare -a summary
for t in "${targets[@]}"; do
  bin=$build/tests/fuzz/fuzz_$t
  seeds=tests/fuzz/corpus/$t
  if [ ! -x "$bin" ]; then echo "fuzz: $bin not built (ninja -C $build)"; fail=1; continue; fi
  work=$build/fuzz-work/$t
  mkdir -p "$work/corpus" "$work/artifacts"

  # Known findings: the signature of each reproducer that still fails.
  declare -A known=()
  for f in tests/fuzz/findings/$t/*; do
    [ -f "$f" ] || continue
    log=$work/known.log
    for attempt in 1 2 3; do  # again if its report deadlocked
      watched "$log" $(( $(date +%s) + 60 )) "$bin" "${limits[@]}" "$f"
      rc=$?
      [ $rc -ne 0 ] && deadlocked "$log" || break
    done
    if [ $rc -eq 0 ]; then
      echo "fuzz $t: known finding $f no longer reproduces: fixed? then move it into $seeds/, so that every run replays it"
    else
      sig=$(signature "$log")
      known[$sig]=$f
      echo "fuzz $t: known finding $f: $sig"
    fi
  done

  end=$(( $(date +%s) + seconds ))
  execs=0 runs=0 quick=0 t0=$(date +%s) status=ok
  while :; do
    started=$(date +%s)
    left=$(( end - started ))
    [ $left -ge 1 ] || break
    runs=$((runs + 1))
    art=$work/artifacts/run$runs/
    rm -rf "$art" && mkdir -p "$art"
    log=$work/run$runs.log
    watched "$log" $((end + 60)) "$bin" "${limits[@]}" -max_total_time=$left -print_final_stats=1 \
      -dict="$(dict_of "$t")" -artifact_prefix="$art" "$work/corpus" "$seeds"
    rc=$?
    n=$(grep -m1 -oE '^stat::number_of_executed_units: [0-9]+' "$log" | grep -oE '[0-9]+$')
    [ -n "$n" ] || n=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
    execs=$((execs + ${n:-0}))
    [ $rc -ne 0 ] || break
    input=$(find "$art" -type f ! -name 'slow-unit-*' | head -1)
    sig=$(signature "$log")
    # A hang whose report deadlocked has no input and no stack: taken for a known hang of this
    # target if it has one (it comes back with a full report if it is new), else a finding.
    if deadlocked "$log"; then
      for k in "${!known[@]}"; do
        case $k in "libFuzzer: timeout"*) sig=$k ;; esac
      done
    fi
    if [ -n "${known[$sig]+x}" ]; then
      deadlocked "$log" && echo "fuzz $t: a hang whose report deadlocked (input lost); taken for the known hang below"
      echo "fuzz $t: found known finding again (${known[$sig]}): $sig; going on"
      status=known
      # A known finding hit at once (say, by a seed) would restart forever: stop after 5.
      [ $(( $(date +%s) - started )) -gt 2 ] || quick=$((quick + 1))
      if [ $quick -ge 5 ]; then echo "fuzz $t: the known finding comes back at once; stopping this target"; break; fi
      continue
    fi
    status=NEW
    fail=1
    echo "::error:: fuzz $t: NEW FINDING: $sig"
    deadlocked "$log" && echo "(a hang whose timeout report deadlocked: its input is lost; run the target longer to catch it again)"
    echo "----- libFuzzer's report ($log, last 60 lines) -----"
    tail -60 "$log"
    if [ -n "$input" ]; then
      echo "----- reproducer: $input ($(stat -c %s "$input") bytes) -----"
      xxd "$input" | head -64
      echo "----- base64 -----"
      base64 -w 76 "$input"
      echo "----- replay: $bin $input"
      echo "----- known, not fixed yet? copy it to tests/fuzz/findings/$t/ -----"
    fi
    break
  done
  dur=$(( $(date +%s) - t0 ))
  [ $dur -gt 0 ] || dur=1
  summary+=("$(printf '%-12s %8d s %12d execs %9d exec/s  %s' "$t" "$dur" "$execs" $((execs / dur)) "$status")")
  unset known
done

echo "fuzz summary (BUILD=$build, $seconds s a target):"
printf '  %s\n' "${summary[@]}"
exit $fail
