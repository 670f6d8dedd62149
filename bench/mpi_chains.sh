#!/usr/bin/env bash
# Issue 18's scaling figure: wall time of `--chains 4` on MNIST (MLP 784-100-10, SGHMC)
# in one process (the pool's threads, one chain per thread) and on 2 MPI ranks (one thread
# each), interleaved A B A B … for ROUNDS rounds; the sample files of every run are checked
# equal to the first one-process run's. Needs a build with `--features mpi`.
# Usage: bench/mpi_chains.sh OUT_DIR [ROUNDS (5)] [EPOCHS (50)]; BNN (default
# target/release/bnn) and BNN_DATA_DIR (default ../shared/data) point at the binary and data.
set -euo pipefail
out=${1:?usage: $0 OUT_DIR [ROUNDS] [EPOCHS]}
rounds=${2:-5}
epochs=${3:-50}
bnn=$(realpath "${BNN:-target/release/bnn}")
data=${BNN_DATA_DIR:-../shared/data}
mkdir -p "$out"
# Burn-in: the default 10 of 50 epochs, scaled with EPOCHS.
args=(train --dataset mnist --data-dir "$data/mnist" --offline --chains 4 --epochs "$epochs"
  --burnin $((epochs / 5)) --no-progress -q --out "$out")
seconds() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null || exit 1; t1=$(date +%s.%N)
  python3 -c "print(round($t1 - $t0, 1))"; }
same() { # the sample files of run $1 equal those of run one-1
  for k in 0 1 2 3; do
    diff -rq "$out/one-1/chain-$k/samples" "$out/$1/chain-$k/samples" >/dev/null || {
      echo "$1: chain $k differs from one-1" >&2; exit 1; }
  done
}
echo "round one_process_s two_ranks_s ratio"
for r in $(seq 1 "$rounds"); do
  a=$(seconds "$bnn" "${args[@]}" --run-name "one-$r")
  b=$(seconds mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -n 2 \
    "$bnn" "${args[@]}" --run-name "two-$r")
  same "one-$r"
  same "two-$r"
  echo "$r $a $b $(python3 -c "print(round($a / $b, 3))")"
done
