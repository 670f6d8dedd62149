# Sourced by scripts/gpu-check.sh, gpu-bench.sh, gpu-runs.sh and gpu-all.sh: what they do on
# a GPU machine. `fail` must be defined by the caller.

# The GPU's name and compute capability ("NVIDIA H200, 9.0"), or a failure saying why
# there is none.
gpu_name() {
    command -v nvidia-smi >/dev/null 2>&1 ||
        fail "no nvidia-smi: this machine has no NVIDIA driver, and the check needs a CUDA GPU"
    local gpu
    gpu=$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | head -1)
    [ -n "$gpu" ] || fail "nvidia-smi lists no GPU"
    echo "$gpu"
}

# The scripts' `--bundle FILE` as their first two arguments into `bundle`, or a failure
# saying how to call $1 (the script's name and the rest of its usage).
bundle_arg() {
    local usage=$1
    shift
    [ "${1:-}" = "--bundle" ] || fail "usage: $usage"
    bundle=${2:-}
    [ -f "$bundle" ] || fail "no bundle at '$bundle' (make one with scripts/gpu-bundle.sh)"
}

# Unpacks the bundle $1 (scripts/gpu-bundle.sh) into a new folder, places `bnn` at the path
# it was built at (the GPU tests run it from there), finds the CUDA libraries, and sets
# bundle_dir, bnn_exe, bundle_commit and LD_LIBRARY_PATH. $2: the GPU's compute capability.
unpack_bundle() {
    bundle_dir=$(mktemp -d)
    # Python's tarfile where the machine has no xz.
    tar -C "$bundle_dir" -xJf "$1" 2>/dev/null ||
        python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
            "$1" "$bundle_dir" || fail "cannot unpack $1"
    local cap major libs missing
    cap=$(manifest compute_cap)
    [ "$cap" = "$(echo "$2" | tr -d ' .')" ] ||
        echo "note: the bundle's kernels are PTX for sm_$cap, JIT-compiled for this GPU" >&2
    bnn_exe=$(manifest bnn_exe)
    mkdir -p "$(dirname "$bnn_exe")" && cp "$bundle_dir/bnn" "$bnn_exe" ||
        fail "cannot place bnn at $bnn_exe"
    # The CUDA libraries: the toolkit's, or the NVIDIA wheels of a Python install.
    major=$(manifest cuda)
    libs=$(find /usr /opt "${CUDA_ROOT:-/usr/local/cuda}/" -xdev \( -name "libcublas.so.$major" \
        -o -name libcurand.so.10 -o -name "libcudart.so.$major" \) 2>/dev/null |
        xargs -r -n1 dirname | sort -u | tr '\n' ':')
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:-}"
    missing=$(ldd "$bnn_exe" | grep 'not found')
    [ -z "$missing" ] || fail "libraries not found: $missing"
    bundle_commit=$(manifest commit)
}

# A key of the unpacked bundle's manifest.
manifest() { sed -n "s/^$1=//p" "$bundle_dir/manifest"; }
