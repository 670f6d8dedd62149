#!/usr/bin/env bash
# The GPU benchmark (docs/BENCHMARKS.md, "GPU"): on a machine with an NVIDIA GPU, PyTorch
# and JAX but no Rust, runs `bnn` from a bundle of scripts/gpu-bundle.sh beside the same
# SGHMC step in PyTorch eager, PyTorch with a CUDA graph and JAX jit, K chains at once, in
# one interleaved run (bench/gpu_peers.py), and prints one table of chain-steps per second
# with the GPU, its driver and the commit. Rows: MLP 784-100-10 at batch 100 with K = 1 and
# 64 chains, 784-400-400-10 at batch 1000 with K = 1 and 16, ResNet-8 and ResNet-20 at
# batch 128 with K = 1 and 8; bnn both through the step plan (`--backward auto`) and through
# candle (`--backward autograd`). Where `nsys` is installed, also the CUDA kernels per
# update of one row on each bnn path. Without a GPU it stops at once, saying why.
#
#   scripts/gpu-bench.sh --bundle FILE [--rounds N] [--seconds S] [--rows NAME:BATCH:K,K ...]
#
# PYTHON names the interpreter with torch and jax (default python3). The whole run is
# limited to BNN_BENCH_LIMIT seconds (default 450), inside a device session's 8 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."

fail() {
    echo "gpu-bench: FAILED: $*" >&2
    exit 1
}
. scripts/gpu-common.sh

bundle_arg "scripts/gpu-bench.sh --bundle FILE [gpu_peers.py options]" "$@"
shift 2
gpu=$(gpu_name) || exit 1
PYTHON=${PYTHON:-python3}
"$PYTHON" -c 'import torch, jax' 2>/dev/null ||
    fail "$PYTHON cannot import torch and jax (set PYTHON to an interpreter that can)"
"$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' ||
    fail "PyTorch sees no CUDA device"
unpack_bundle "$bundle" "${gpu##*,}"
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
echo "== gpu-bench: $gpu, driver $driver, CUDA $(manifest cuda), bnn $bundle_commit"
echo "   torch $("$PYTHON" -c 'import torch; print(torch.__version__)'), jax $("$PYTHON" -c 'import jax; print(jax.__version__)')"

if command -v nsys >/dev/null 2>&1; then
    # Kernels per update: one short run of 64 chains (3 epochs of 100 updates), through the
    # step plan (--backward auto; its graphs traced node by node) and through candle.
    prof=$(mktemp -d)
    for backward in auto autograd; do
        nsys profile -o "$prof/$backward" --force-overwrite true --stats=false \
            --cuda-graph-trace=node "$bnn_exe" train \
            --dataset mnist-mini --offline --device cuda --chains 64 --chain-layout stacked \
            --backward "$backward" --sampler sghmc --integrator euler --epochs 3 --burnin 2 \
            --thin 100000000 --decay-at --no-progress --out "$prof" --run-name "$backward" \
            -q >/dev/null 2>&1 &&
            kernels=$(nsys stats -q --report cuda_gpu_kern_sum --format csv \
                "$prof/$backward.nsys-rep" 2>/dev/null |
                python3 -c 'import csv, sys
rows = list(csv.DictReader(l for l in sys.stdin if "," in l))
print(sum(int(r["Instances"]) for r in rows))') &&
            echo "== kernels (--backward $backward): $kernels launches in 300 updates of 64 chains (with setup), $((kernels / 300)) an update"
    done
fi

timeout "${BNN_BENCH_LIMIT:-450}" "$PYTHON" bench/gpu_peers.py --bnn "$bnn_exe" "$@" ||
    fail "bench/gpu_peers.py stopped (exit $?)"
echo "gpu-bench: DONE"
