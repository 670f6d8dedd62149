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

bundle=""
if [ "${1:-}" = "--bundle" ]; then
    bundle=${2:?"--bundle needs the archive made by scripts/gpu-bundle.sh"}
    [ -f "$bundle" ] || fail "no bundle at $bundle"
fi
command -v nvidia-smi >/dev/null 2>&1 ||
    fail "no nvidia-smi: this machine has no NVIDIA driver, and the check needs a CUDA GPU"
gpu=$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | head -1)
[ -n "$gpu" ] || fail "nvidia-smi lists no GPU"
export BNN_DATA_DIR="${BNN_DATA_DIR:-$(cd .. && pwd)/shared/data}"
export BNN_REQUIRE_DATA=1 BNN_TEST_CUDA=1
log=$(mktemp)

if [ -n "$bundle" ]; then
    dir=$(mktemp -d)
    # Python's tarfile where the machine has no xz.
    tar -C "$dir" -xJf "$bundle" 2>/dev/null ||
        python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
            "$bundle" "$dir" || fail "cannot unpack $bundle"
    manifest() { sed -n "s/^$1=//p" "$dir/manifest"; }
    cap=$(manifest compute_cap)
    [ "$cap" = "$(echo "${gpu##*,}" | tr -d ' .')" ] ||
        echo "gpu-check: note: the bundle's kernels are PTX for sm_$cap, JIT-compiled for this GPU"
    # The GPU tests run `bnn` from the path it was built at.
    exe=$(manifest bnn_exe)
    mkdir -p "$(dirname "$exe")" && cp "$dir/bnn" "$exe" || fail "cannot place bnn at $exe"
    # The CUDA libraries: the toolkit's, or the NVIDIA wheels of a Python install.
    major=$(manifest cuda)
    libs=$(find /usr /opt "${CUDA_ROOT:-/usr/local/cuda}/" -xdev \( -name "libcublas.so.$major" \
        -o -name libcurand.so.10 -o -name "libcudart.so.$major" \) 2>/dev/null |
        xargs -r -n1 dirname | sort -u | tr '\n' ':')
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:-}"
    missing=$(ldd "$exe" | grep 'not found')
    [ -z "$missing" ] || fail "libraries not found: $missing"
    commit="$(manifest commit) (bundle)"
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
