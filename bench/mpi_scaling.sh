#!/usr/bin/env bash
# The MPI scaling figures on MNIST (MLP 784-100-10), in one process (the pool's threads)
# and on 2 MPI ranks (one thread each), interleaved A B A B … for ROUNDS rounds:
#   chains:   `--chains 4` (SGHMC); every run's sample files are checked equal to the
#             first one-process run's;
#   replicas: `--sampler renhd --replicas 4 --prior gaussian`; the T0 samples and the
#             ladder are checked equal, and the bytes of energies each exchange round sent
#             between the ranks are printed (summary.json's replica_exchange.exchange_bytes
#             over its rounds).
# Needs a build with `--features mpi`.
# Usage: bench/mpi_scaling.sh chains|replicas OUT_DIR [ROUNDS (5)] [EPOCHS (50)]; BNN
# (default target/release/bnn) and BNN_DATA_DIR (default ../shared/data) point at the
# binary and data.
set -euo pipefail
mode=${1:?usage: $0 chains|replicas OUT_DIR [ROUNDS] [EPOCHS]}
out=${2:?usage: $0 chains|replicas OUT_DIR [ROUNDS] [EPOCHS]}
rounds=${3:-5}
epochs=${4:-50}
bnn=$(realpath "${BNN:-target/release/bnn}")
data=${BNN_DATA_DIR:-../shared/data}
mkdir -p "$out"
case $mode in
  chains) spread=(--chains 4); dirs=(chain-0 chain-1 chain-2 chain-3) ;;
  replicas) spread=(--sampler renhd --replicas 4 --prior gaussian); dirs=(chain-0) ;;
  *) echo "$0: mode is chains or replicas, not $mode" >&2; exit 2 ;;
esac
# Burn-in: the default 10 of 50 epochs, scaled with EPOCHS.
args=(train --dataset mnist --data-dir "$data/mnist" --offline "${spread[@]}"
  --epochs "$epochs" --burnin $((epochs / 5)) --no-progress -q --out "$out")
seconds() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null || exit 1; t1=$(date +%s.%N)
  python3 -c "print(round($t1 - $t0, 1))"; }
same() { # the samples (and the ladder) of run $1 equal those of run one-1
  for d in "${dirs[@]}"; do
    diff -rq "$out/one-1/$d/samples" "$out/$1/$d/samples" >/dev/null || {
      echo "$1: $d differs from one-1" >&2; exit 1; }
  done
  [ "$mode" = chains ] || python3 - "$out/one-1" "$out/$1" <<'PY' || exit 1
import json, sys
a, b = (json.load(open(f"{r}/summary.json"))["replica_exchange"] for r in sys.argv[1:])
sys.exit(0 if a["ladder"] == b["ladder"] else f"{sys.argv[2]}: ladder differs")
PY
}
per_round() { python3 - "$out/$1/summary.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["replica_exchange"]
print(r["exchange_bytes"] // max(r["ladder"]["rounds"], 1))
PY
}
echo "round one_process_s two_ranks_s ratio$([ "$mode" = replicas ] && echo " bytes_per_round")"
for r in $(seq 1 "$rounds"); do
  a=$(seconds "$bnn" "${args[@]}" --run-name "one-$r")
  b=$(seconds mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -n 2 \
    "$bnn" "${args[@]}" --run-name "two-$r")
  same "one-$r"
  same "two-$r"
  extra=""
  [ "$mode" = replicas ] && extra=" $(per_round "two-$r")"
  echo "$r $a $b $(python3 -c "print(round($a / $b, 3))")$extra"
done
