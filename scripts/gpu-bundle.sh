#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh runs into one archive, on a machine with nvcc and no GPU,
# for a GPU machine that has the NVIDIA driver and CUDA libraries but no Rust toolchain:
# there `scripts/gpu-check.sh --bundle FILE` runs it from a checkout of the same commit.
#
# The CUDA libraries that cudarc links (libcuda, libcublas, libcurand, libnvrtc) are not on
# a machine without a driver, so the binaries are linked against stubs made here: one
# empty function per symbol that the built crates leave undefined, under the real
# library's SONAME. The dynamic loader of the GPU machine binds the real libraries.
#
#   CUDA_ROOT=/usr/local/cuda scripts/gpu-bundle.sh [OUT]   # OUT: target/gpu-bundle.tar.xz
#
# CARGO_TARGET_DIR is respected (CI keeps its CUDA build outside the clone); the absolute
# path of the `bnn` binary is compiled into the GPU tests, so the bundle records it.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-target/gpu-bundle.tar.xz}")

export CUDA_ROOT="${CUDA_ROOT:-/usr/local/cuda}"
export PATH="$CUDA_ROOT/bin:$PATH" CUDA_PATH="$CUDA_ROOT"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
command -v nvcc >/dev/null 2>&1 || {
    echo "gpu-bundle: no nvcc under \$CUDA_ROOT/bin ($CUDA_ROOT) or on PATH" >&2
    exit 1
}
major=$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
target=$(realpath -m "${CARGO_TARGET_DIR:-target/gpu-bundle}")
export CARGO_TARGET_DIR="$target"

# 1. Everything the tests need, compiled; linking fails here for want of the CUDA
# libraries (the same command as step 2, so that cargo builds each crate once).
stubs="$target/cuda-stubs"
rm -rf "$stubs" && mkdir -p "$stubs"
build() {
    LIBRARY_PATH="$stubs${LIBRARY_PATH:+:$LIBRARY_PATH}" cargo test --release --features cuda \
        --test gpu --test suite --no-run --message-format=json-render-diagnostics "$@"
}
build >"$stubs/first-build" 2>&1 || true
# The CUDA symbols the built crates leave undefined. (nm also meets each rlib's metadata
# member, which it cannot read: its status is ignored.)
{
    find "$target/release/deps" -name '*.rlib' \( -name 'libcudarc-*' -o -name 'libcandle*' \) \
        -exec nm --undefined-only --format=just-symbols {} + 2>/dev/null || true
} | grep -E '^(cu|nvrtc)' | sort -u >"$stubs/symbols"
stub() { # name soname pattern
    grep -E "$3" "$stubs/symbols" | sed 's/.*/void &(void) {}/' >"$stubs/$1.c"
    cc -shared -fPIC -Wl,-soname,"$2" -o "$stubs/lib$1.so" "$stubs/$1.c"
}
stub cuda libcuda.so.1 '^cu[A-Z]'
stub cublas "libcublas.so.$major" '^cublas[^L]'
stub cublasLt "libcublasLt.so.$major" '^cublasLt'
stub curand libcurand.so.10 '^curand'
stub nvrtc "libnvrtc.so.$major" '^nvrtc'
# The runtime is part of every toolkit (the PyPI wheels too): the real one.
cudart=$(find -L "$CUDA_ROOT" -name "libcudart.so.$major" -print -quit)
[ -n "$cudart" ] || { echo "gpu-bundle: no libcudart.so.$major under $CUDA_ROOT" >&2; exit 1; }
ln -sf "$cudart" "$stubs/libcudart.so"

# 2. The binaries, linked against the stubs; their paths from cargo's JSON messages.
build >"$stubs/messages"
exe() { # target name -> executable
    python3 -c 'import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == sys.argv[2] \
            and m.get("executable"):
        print(m["executable"])' "$stubs/messages" "$1" | tail -1
}
pack=$(mktemp -d)
strip -o "$pack/bnn" "$target/release/bnn"
strip -o "$pack/gpu-test" "$(exe gpu)"
strip -o "$pack/suite-test" "$(exe suite)"
printf 'bnn_exe=%s\ncommit=%s\ncuda=%s\ncompute_cap=%s\n' "$target/release/bnn" \
    "$(git rev-parse --short HEAD)" "$major" "$CUDA_COMPUTE_CAP" >"$pack/manifest"
mkdir -p "$(dirname "$out")"
XZ_OPT=-T0 tar -C "$pack" -cJf "$out" manifest bnn gpu-test suite-test
rm -rf "$pack"
echo "gpu-bundle: $out ($(du -h "$out" | cut -f1); CUDA $major, sm_$CUDA_COMPUTE_CAP, $(git rev-parse --short HEAD))"
