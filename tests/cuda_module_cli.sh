#!/usr/bin/env bash
# The CUDA backend as a loadable module (backend/cuda_module.h) at the command line: commands
# that build no CUDA executor never map it or the CUDA libraries; --backend cuda loads it from
# beside the binary (or $TANDEM_CUDA_MODULE), refuses a missing or stale one with exit 2, and
# the module's own exceptions reach main's handlers (2 for bad input, 1 for no GPU).
# Usage: cuda_module_cli.sh TANDEM_BINARY SOURCE_DIR cuda|nocuda FAKE_MODULE_DIR
set -u
tandem=$1
src=$2
cuda_build=$3
fakes=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
passes=0
unset TANDEM_CUDA_MODULE

# expect STATUS PATTERN [ENV=VALUE ...] -- ARGS...: run tandem (with those variables set), check
# the exit status and that its output matches PATTERN (grep -E; empty: any output, none too). The
# output is left in $tmp/out.
expect() {
  local want=$1 pattern=$2
  shift 2
  local envs=()
  while [ "$1" != -- ]; do
    envs+=("$1")
    shift
  done
  shift
  env "${envs[@]}" timeout 60 "$tandem" "$@" >"$tmp/out" 2>&1
  local rc=$?
  if ! [[ $rc =~ ^($want)$ ]] || { [ -n "$pattern" ] && ! grep -qE -- "$pattern" "$tmp/out"; }; then
    echo "FAIL: ${envs[*]} tandem $* -> exit $rc (want $want), output:"
    grep -v '^ *[0-9]*:' "$tmp/out" | head -8 | sed 's/^/    /'
    echo "    (wanted /$pattern/)"
    fails=$((fails + 1))
  else
    passes=$((passes + 1))
  fi
}
# mapped PATTERN: whether the last command's dynamic loader log (LD_DEBUG=files) shows a
# library matching PATTERN being loaded.
mapped() { grep -qE "file=[^ ]*($1)[^ ]* +\[" "$tmp/out"; }
check() {  # check DESCRIPTION COMMAND...: a condition, counted
  local what=$1
  shift
  if "$@"; then
    passes=$((passes + 1))
  else
    echo "FAIL: $what"
    fails=$((fails + 1))
  fi
}
cuda_libs='tandem-cuda|libcublas|libcudart|libnccl'

# Commands that build no CUDA executor: no CUDA library is mapped, and the module is never looked
# for (a bad override does not matter).
expect 0 "usage:" LD_DEBUG=files -- --help
check "--help maps no CUDA library" eval '! mapped "$cuda_libs"'
check "the loader log is seen at all (libfmt)" mapped libfmt
expect 0 "" LD_DEBUG=files -- run "$src/workloads/quickstart.yaml" --quiet --out "$tmp/run"
check "a simulated run maps no CUDA library" eval '! mapped "$cuda_libs"'
check "a simulated run writes its summary" test -s "$tmp/run/summary.json"
expect 0 "usage:" TANDEM_CUDA_MODULE=/nonexistent/tandem-cuda.so -- --help
expect 0 "" TANDEM_CUDA_MODULE=/nonexistent/tandem-cuda.so -- run "$src/workloads/quickstart.yaml" --quiet --out "$tmp/run2"
expect 0 "" LD_DEBUG=files -- run "$src/workloads/cpu_tiny.yaml" --backend cpu --threads 1 --quiet --set requests.count=2
check "a CPU run maps no CUDA library" eval '! mapped "$cuda_libs"'
check "the binary does not link the CUDA libraries" eval '! ldd "$tandem" | grep -qE "libcublas|libcudart|libnccl"'

if [ "$cuda_build" = nocuda ]; then
  check "no module beside the binary" test ! -e "$(dirname "$tandem")/tandem-cuda.so"
  # The override is not consulted: this binary exports nothing for a module to bind to.
  expect 2 "--backend cuda: this build has no CUDA backend" TANDEM_CUDA_MODULE="$fakes/fake-cuda-throwing.so" -- run "$src/workloads/cpu_tiny.yaml" --backend cuda
  expect 2 "tandem worker: --backend cuda: not available in this build \\(known: cpu\\)" -- worker --listen 127.0.0.1:0 --backend cuda
  expect 2 "calibrate --backend cuda: not available in this build \\(known: cpu\\)" -- calibrate --backend cuda --model tiny --out "$tmp/p.yaml"
else
  module=$(dirname "$(readlink -f "$tandem")")/tandem-cuda.so
  check "the module is beside the binary" test -f "$module"
  check "the module links the CUDA libraries" eval 'ldd "$module" | grep -q libcublasLt'
  # The real module: an InputError thrown inside it (a head size its attention kernel does not
  # take, checked before any GPU is looked for) goes through main's InputError handler: exit 2.
  expect 2 "^tandem: model 'tiny': head_dim 16 is not supported by the CUDA attention kernel" LD_DEBUG=files -- run "$src/workloads/cpu_tiny.yaml" --backend cuda --set model.heads=16
  check "--backend cuda maps the module and cuBLASLt" eval 'mapped tandem-cuda && mapped libcublasLt'
  if ! nvidia-smi -L >/dev/null 2>&1; then  # its std::runtime_error: main's run-time handler, exit 1
    expect 1 "^tandem: run failed: --backend cuda: no usable CUDA device" -- run "$src/workloads/cpu_tiny.yaml" --backend cuda
  fi
  # Found through /proc/self/exe: a symlink to the binary elsewhere still finds it; a copy does not.
  ln -s "$(readlink -f "$tandem")" "$tmp/tandem-link"
  mkdir "$tmp/bin" && cp "$(readlink -f "$tandem")" "$tmp/bin/tandem"
  real=$tandem
  tandem=$tmp/tandem-link
  expect 2 "head_dim 16 is not supported" -- run "$src/workloads/cpu_tiny.yaml" --backend cuda --set model.heads=16
  tandem=$tmp/bin/tandem
  expect 2 "the CUDA backend module \\(tandem-cuda.so\\) was not found; looked at \\(beside the binary, then where it is installed\\)" -- run "$src/workloads/cpu_tiny.yaml" --backend cuda
  check "the message names the path beside the binary" grep -qF "$tmp/bin/tandem-cuda.so: not found" "$tmp/out"
  check "the message says how to name another" grep -qF "TANDEM_CUDA_MODULE=PATH names another" "$tmp/out"
  expect 2 "head_dim 16 is not supported" TANDEM_CUDA_MODULE="$module" -- run "$src/workloads/cpu_tiny.yaml" --backend cuda --set model.heads=16
  # A bare file name in the override is a file in the current folder, not a library name for
  # dlopen to search its paths for.
  tandem=$(readlink -f "$real")
  mkdir "$tmp/mod" && cp "$module" "$tmp/mod/my-cuda.so"
  pushd "$tmp/mod" >/dev/null
  expect 2 "head_dim 16 is not supported" TANDEM_CUDA_MODULE=my-cuda.so -- run "$src/workloads/cpu_tiny.yaml" --backend cuda --set model.heads=16
  popd >/dev/null
  tandem=$real
  # The override wins, and a missing, stale or foreign module is refused with exit 2.
  expect 2 "TANDEM_CUDA_MODULE is set\\):" TANDEM_CUDA_MODULE=/nonexistent/tandem-cuda.so -- run "$src/workloads/cpu_tiny.yaml" --backend cuda
  check "the override's path is named" grep -qF "/nonexistent/tandem-cuda.so: not found" "$tmp/out"
  expect 2 "a stale CUDA module \\(its interface version 0" TANDEM_CUDA_MODULE="$fakes/fake-cuda-stale.so" -- run "$src/workloads/cpu_tiny.yaml" --backend cuda
  check "a module that is there but refused: would not load" grep -qF "module (tandem-cuda.so) would not load; tried" "$tmp/out"
  expect 2 "not a tandem CUDA module" TANDEM_CUDA_MODULE="$fakes/fake-cuda-no-entry.so" -- run "$src/workloads/cpu_tiny.yaml" --backend cuda
  expect 2 "cannot be loaded: .*README.md" TANDEM_CUDA_MODULE="$src/README.md" -- run "$src/workloads/cpu_tiny.yaml" --backend cuda
  # A module's InputError, and its channel factory's std::runtime_error, through main's handlers.
  expect 2 "^tandem: fake CUDA module: refused this model" TANDEM_CUDA_MODULE="$fakes/fake-cuda-throwing.so" -- run "$src/workloads/cpu_tiny.yaml" --backend cuda
  # calibrate and worker take the same module; calibrate fails before it measures.
  expect 2 "CUDA backend module \\(tandem-cuda.so\\) was not found" TANDEM_CUDA_MODULE=/nonexistent/tandem-cuda.so -- calibrate --backend cuda --model tiny --quick --out "$tmp/p.yaml"
  expect 0 "usage: tandem worker" TANDEM_CUDA_MODULE=/nonexistent/tandem-cuda.so -- worker --help
fi

echo "cuda module cli: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
