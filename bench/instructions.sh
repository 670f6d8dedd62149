#!/usr/bin/env bash
# Instructions per training step of two bnn binaries, counted by valgrind on one thread:
# deterministic where wall time on a shared machine is not. Each figure is
# (Ir(30 steps) − Ir(10 steps)) / 40 (bench train also runs one warm-up repeat).
# Usage: bench/instructions.sh A_BIN B_BIN [bench-train flags, default the MLP-100 at batch 100]
# (one --batch; for a CNN give its --cnn-batch the same value, since the steps are
# chosen for --batch, 100 unless given).
set -euo pipefail
a=$1; b=$2; shift 2
flags=("$@")
[ ${#flags[@]} -eq 0 ] && flags=(--hidden 100 --batch 100 --cnn-batch "" --sampler sghmc)
ir() {
    RAYON_NUM_THREADS=1 valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \
        "$@" 2>&1 | awk '/I *refs/ {gsub(",", "", $4); print $4}'
}
# `--steps` counts batch-100 steps (scaled by 100/batch): ask for 10 and 30 at the batch.
batch=100
for ((i = 0; i + 1 < ${#flags[@]}; i++)); do
    [ "${flags[i]}" = --batch ] && batch=${flags[i + 1]}
done
for bin in "$a" "$b"; do
    lo=$(ir "$bin" bench train "${flags[@]}" --steps $((batch / 10)) --repeats 1)
    hi=$(ir "$bin" bench train "${flags[@]}" --steps $((3 * batch / 10)) --repeats 1)
    echo "$bin: $(( (hi - lo) / 40 )) instructions per step"
done
