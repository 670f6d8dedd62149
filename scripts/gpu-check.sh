#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, runs tests/gpu.rs on CUDA device 0
# (BNN_TEST_CUDA=1): the fused step of every sampler against the CPU path on the same
# Philox noise, a short MNIST training whose per-epoch loss must match the CPU's within
# 1e-3 relative, and a throughput line; plus the host-side kernel equivalence tests.
# Prints one summary and exits 0 only when everything passed. Without a GPU it stops at
# once, saying why.
#
#   scripts/gpu-check.sh                 # builds with cargo --features cuda (needs nvcc)
#   scripts/gpu-check.sh --bundle FILE   # runs scripts/gpu-bundle.sh's prebuilt binaries
#                                        # (a GPU machine without Rust; same commit)
# BNN_DATA_DIR defaults to ../shared/data.
set -uo pipefail
cd "$(dirname "$0")/.."

fail() {
    echo "gpu-check: FAILED: $*" >&2
    exit 1
}
. scripts/gpu-common.sh

bundle=""
if [ "${1:-}" = "--bundle" ]; then
    bundle=${2:?"--bundle needs the archive made by scripts/gpu-bundle.sh"}
    [ -f "$bundle" ] || fail "no bundle at $bundle"
fi
gpu=$(gpu_name) || exit 1
export BNN_DATA_DIR="${BNN_DATA_DIR:-$(cd .. && pwd)/shared/data}"
export BNN_REQUIRE_DATA=1 BNN_TEST_CUDA=1
log=$(mktemp)

if [ -n "$bundle" ]; then
    unpack_bundle "$bundle" "${gpu##*,}"
    dir=$bundle_dir exe=$bnn_exe cap=$(manifest compute_cap)
    commit="$bundle_commit (bundle)"
    {
        "$dir/gpu-test" --nocapture --test-threads 1 &&
            "$dir/suite-test" kernel_equivalence::
    } 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
else
    export CUDA_ROOT="${CUDA_ROOT:-/usr/local/cuda}"
    export PATH="$CUDA_ROOT/bin:$PATH"
    command -v nvcc >/dev/null 2>&1 ||
        fail "no nvcc under \$CUDA_ROOT/bin ($CUDA_ROOT) or on PATH: install the CUDA toolkit"
    export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-$(echo "${gpu##*,}" | tr -d ' .')}"
    cap=$CUDA_COMPUTE_CAP
    commit=$(git rev-parse --short HEAD 2>/dev/null)
    {
        cargo test --release --features cuda --test gpu -- --nocapture --test-threads 1 &&
            cargo test --release --features cuda --test suite kernel_equivalence::
    } 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
fi
echo
echo "== gpu-check summary: $gpu (kernels for sm_$cap), $commit"
grep -o 'gpu-check: .*' "$log"
grep -E '^test result' "$log"
[ "$status" -eq 0 ] || fail "the tests exited with $status (the failing test is above)"
grep -q '^gpu-check: throughput' "$log" || fail "the GPU tests did not run (no throughput line)"
echo "gpu-check: PASSED"
