#!/usr/bin/env bash
# Whole runs on the GPU, timed wall to wall (docs/BENCHMARKS.md, "GPU"): the default MNIST
# run (through the step plan) and the ResNet-20 Fashion-MNIST preset (candle), from a
# bundle of scripts/gpu-bundle.sh, each stopped at BNN_RUNS_LIMIT seconds (default 150)
# and then reported as stopped, with the epochs its chains finished (bench/gpu_runs.py).
# Without a GPU it stops at once, saying why.
#
#   scripts/gpu-runs.sh --bundle FILE [gpu_runs.py options]
#
# BNN_DATA_DIR defaults to ../shared/data.
set -uo pipefail
cd "$(dirname "$0")/.."

fail() {
    echo "gpu-runs: FAILED: $*" >&2
    exit 1
}
. scripts/gpu-common.sh

bundle_arg "scripts/gpu-runs.sh --bundle FILE [gpu_runs.py options]" "$@"
shift 2
gpu=$(gpu_name) || exit 1
export BNN_DATA_DIR="${BNN_DATA_DIR:-$(cd .. && pwd)/shared/data}"
unpack_bundle "$bundle" "${gpu##*,}"
echo "== gpu-runs: $gpu, bnn $bundle_commit, each run at most ${BNN_RUNS_LIMIT:-150} s"
python3 bench/gpu_runs.py --bnn "$bnn_exe" --device cuda --limit "${BNN_RUNS_LIMIT:-150}" "$@" ||
    fail "a run failed (above)"
echo "gpu-runs: DONE"
