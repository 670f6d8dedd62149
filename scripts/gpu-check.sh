#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU and the CUDA toolkit, builds bnn with
# `--features cuda` and runs tests/gpu.rs on CUDA device 0 (BNN_TEST_CUDA=1): the fused
# step of every sampler with a CUDA kernel against the CPU path on the same Philox noise,
# a short MNIST training whose per-epoch loss must match the CPU's within 1e-3 relative,
# and a throughput line; plus the host-side kernel equivalence tests. Prints one summary
# and exits 0 only when everything passed. Without a GPU it stops at once, saying why.
#
#   scripts/gpu-check.sh            # BNN_DATA_DIR defaults to ../shared/data
set -uo pipefail
cd "$(dirname "$0")/.."

fail() {
    echo "gpu-check: FAILED: $*" >&2
    exit 1
}

command -v nvidia-smi >/dev/null 2>&1 ||
    fail "no nvidia-smi: this machine has no NVIDIA driver, and the check needs a CUDA GPU"
gpu=$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | head -1)
[ -n "$gpu" ] || fail "nvidia-smi lists no GPU"
export CUDA_ROOT="${CUDA_ROOT:-/usr/local/cuda}"
export PATH="$CUDA_ROOT/bin:$PATH"
command -v nvcc >/dev/null 2>&1 ||
    fail "no nvcc under \$CUDA_ROOT/bin ($CUDA_ROOT) or on PATH: install the CUDA toolkit"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-$(echo "${gpu##*,}" | tr -d ' .')}"
export BNN_DATA_DIR="${BNN_DATA_DIR:-$(cd .. && pwd)/shared/data}"
export BNN_REQUIRE_DATA=1 BNN_TEST_CUDA=1

log=$(mktemp)
{
    cargo test --release --features cuda --test gpu -- --nocapture --test-threads 1 &&
        cargo test --release --features cuda --test suite kernel_equivalence::
} 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
echo
echo "== gpu-check summary: $gpu (sm_$CUDA_COMPUTE_CAP), $(git rev-parse --short HEAD 2>/dev/null)"
grep '^gpu-check:' "$log"
grep -E '^test result' "$log"
[ "$status" -eq 0 ] || fail "cargo test exited with $status (the failing test is above)"
grep -q '^gpu-check: throughput' "$log" || fail "the GPU tests did not run (no throughput line)"
echo "gpu-check: PASSED"
