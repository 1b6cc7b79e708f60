#!/usr/bin/env bash
# A `tandem sweep plan` folder's points with GNU parallel, K points a job, JOBS jobs at once, then
# collect (README, "Sweeps"). Usage: tools/sweep/parallel.sh DIR [K] [JOBS]   (TANDEM: the binary;
# default: tandem on PATH, else this checkout's build/tandem). Needs GNU parallel (tools/setup
# --sweep-cluster installs it).
# Edit for other machines: add --sshloginfile NODES to the parallel line (DIR then on a filesystem
# every node sees, tandem at the same path on each). Exit: 0, or collect's / the failed jobs' status.

# --help: the comment above, and nothing else (no build, no install, no device).
case "${1:-}" in -h|--help) awk 'NR > 1 && /^#SBATCH/ { exit } NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;; esac
set -uo pipefail
DIR=${1:?usage: parallel.sh DIR [K] [JOBS]}; K=${2:-2}; JOBS=${3:-$(nproc)}
TANDEM=${TANDEM:-$(command -v tandem || echo "$(cd "$(dirname "$0")/../.." && pwd)/build/tandem")}
command -v parallel >/dev/null || { echo "parallel.sh: GNU parallel is not installed (tools/setup --sweep-cluster)" >&2; exit 2; }
command -v "$TANDEM" >/dev/null || { echo "parallel.sh: no tandem at $TANDEM (set TANDEM=PATH, or build: make)" >&2; exit 2; }
N=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["count"])' "$DIR/plan.json") || exit 2
seq 0 "$K" $((N - 1)) | parallel --will-cite -q -j "$JOBS" "$TANDEM" sweep run "$DIR" --index {} --count "$K" -j 1
failed=$?
"$TANDEM" sweep collect "$DIR" || exit $?
exit $((failed > 0))
