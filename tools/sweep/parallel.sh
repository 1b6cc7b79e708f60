#!/usr/bin/env bash
# A `tandem sweep plan` folder's points with GNU parallel, K points a job, JOBS jobs at once, then
# collect (README, "Sweeps"). Usage: tools/sweep/parallel.sh DIR [K] [JOBS]   (TANDEM: the binary)
# Edit for other machines: add --sshloginfile NODES to the parallel line (DIR then on a filesystem
# every node sees, tandem at the same path on each). Exit: 0, or collect's / the failed jobs' status.
set -uo pipefail
DIR=${1:?usage: parallel.sh DIR [K] [JOBS]}; K=${2:-2}; JOBS=${3:-$(nproc)}; TANDEM=${TANDEM:-tandem}
N=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["count"])' "$DIR/plan.json") || exit 2
seq 0 "$K" $((N - 1)) | parallel --will-cite -q -j "$JOBS" "$TANDEM" sweep run "$DIR" --index {} --count "$K" -j 1
failed=$?
"$TANDEM" sweep collect "$DIR" || exit $?
exit $((failed > 0))
