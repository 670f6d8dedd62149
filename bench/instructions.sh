#!/usr/bin/env bash
# Instructions per training step of two bnn binaries, counted by valgrind on one thread:
# deterministic where wall time on a shared machine is not. Each figure is the
# difference of Ir between runs of about 30 and 10 steps, per step run.
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
# `--steps` counts batch-100 steps: bench train runs max(steps·100/batch, 10) of them per
# repeat. Ask for about 10 and 30 at the batch, and divide by the steps that actually ran
# (twice each: the warm-up repeat and the timed one).
batch=100
for ((i = 0; i + 1 < ${#flags[@]}; i++)); do
    [ "${flags[i]}" = --batch ] && batch=${flags[i + 1]}
done
ran() { local s=$(($1 * 100 / batch)); echo $((s > 10 ? s : 10)); }
lo_steps=$(( (batch + 9) / 10 )); hi_steps=$(( (3 * batch + 9) / 10 ))
extra=$(( 2 * ($(ran $hi_steps) - $(ran $lo_steps)) ))
[ $extra -gt 0 ] || { echo "instructions.sh: no step count to tell apart at batch $batch" >&2; exit 2; }
for bin in "$a" "$b"; do
    lo=$(ir "$bin" bench train "${flags[@]}" --steps $lo_steps --repeats 1)
    hi=$(ir "$bin" bench train "${flags[@]}" --steps $hi_steps --repeats 1)
    echo "$bin: $(( (hi - lo) / extra )) instructions per step"
done
