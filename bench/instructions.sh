#!/usr/bin/env bash
# Instructions per training step of two bnn binaries, counted by valgrind on one thread:
# deterministic where wall time on a shared machine is not. Each figure is
# (Ir(30 steps) − Ir(10 steps)) / 40 (bench train also runs one warm-up repeat).
# Usage: bench/instructions.sh A_BIN B_BIN [bench-train flags, default the MLP-100 at batch 100]
set -euo pipefail
a=$1; b=$2; shift 2
flags=("$@")
[ ${#flags[@]} -eq 0 ] && flags=(--hidden 100 --batch 100 --cnn-batch "" --sampler sghmc)
ir() {
    RAYON_NUM_THREADS=1 valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \
        "$@" 2>&1 | awk '/I *refs/ {gsub(",", "", $4); print $4}'
}
for bin in "$a" "$b"; do
    lo=$(ir "$bin" bench train "${flags[@]}" --steps 10 --repeats 1)
    hi=$(ir "$bin" bench train "${flags[@]}" --steps 30 --repeats 1)
    echo "$bin: $(( (hi - lo) / 40 )) instructions per step"
done
