#!/usr/bin/env bash
# A lent GPU's one prepared run (the device tool lends 15 minutes in all, starting included):
# the check, the benchmark and the whole runs from one bundle, in that order, each
# within its share, every output also written under $OUT (or ./gpu-all) for the
# figures in docs/BENCHMARKS.md. Without a GPU it stops at once, saying why.
#
#   scripts/gpu-all.sh --bundle FILE
#
# Shares (seconds): BNN_BENCH_LIMIT (default 330) for bench/gpu_peers.py, BNN_RUNS_LIMIT
# (default 100) for each whole run; the check takes what its tests take (about 2 min).
set -uo pipefail
cd "$(dirname "$0")/.."

fail() {
    echo "gpu-all: FAILED: $*" >&2
    exit 1
}
. scripts/gpu-common.sh

bundle_arg "scripts/gpu-all.sh --bundle FILE" "$@"
gpu_name >/dev/null || exit 1
dest=${OUT:-gpu-all}
mkdir -p "$dest"
export BNN_BENCH_LIMIT=${BNN_BENCH_LIMIT:-330} BNN_RUNS_LIMIT=${BNN_RUNS_LIMIT:-100}
status=0
for part in check bench runs; do
    start=$(date +%s)
    bash "scripts/gpu-$part.sh" --bundle "$bundle" 2>&1 | tee "$dest/$part.log"
    rc=${PIPESTATUS[0]}
    echo "== gpu-all: $part exited $rc after $(($(date +%s) - start)) s" | tee -a "$dest/$part.log"
    [ "$rc" -eq 0 ] || status=1
done
[ "$status" -eq 0 ] || fail "a part failed (its log is in $dest)"
echo "gpu-all: DONE ($dest)"
