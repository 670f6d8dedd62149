#!/usr/bin/env bash
# Issue 15's Fashion-MNIST table: RENHD (scalar and per-parameter thermostats), RELD,
# SGNHT and SGHMC on the tuned 784-100-10 MLP at label noise p, 50 epochs for the T = 1
# replica (M = 8, --ladder auto), and SGNHT/SGHMC with 8 chains (the replicas' gradient
# evaluations). Usage: bench/replicas_fashion.sh OUT_DIR [P ...]  (default P: 0.2 0 0.3)
# BNN (default target/release/bnn) and BNN_DATA_DIR must point at the binary and data.
set -euo pipefail
out=${1:?usage: $0 OUT_DIR [P ...]}
shift
ps=("$@")
[ ${#ps[@]} -gt 0 ] || ps=(0.2 0 0.3)
bnn=${BNN:-target/release/bnn}
common=(--dataset fashion-mnist --offline --standardize --batch-size 200 --step-size 1e-6
  --epochs 50 --no-progress -q --out "$out")
replicas=(--replicas 8 --ladder auto --exchange-every 100)
for p in "${ps[@]}"; do
  run() {
    local name=$1
    shift
    if [ -f "$out/$name/summary.json" ]; then return; fi
    echo "$(date -u +%FT%TZ) start $name" >&2
    "$bnn" train "${common[@]}" --permute-labels "$p" --run-name "$name" "$@" >/dev/null
    echo "$(date -u +%FT%TZ) done $name" >&2
  }
  run "p$p-renhd" --sampler renhd "${replicas[@]}"
  run "p$p-sgnht" --sampler sgnht --integrator euler
  run "p$p-sghmc" --sampler sghmc
  run "p$p-renhd-per-param" --sampler renhd "${replicas[@]}" --replica-thermostat per-parameter
  run "p$p-reld" --sampler reld "${replicas[@]}"
  run "p$p-sgnht-8chains" --sampler sgnht --integrator euler --chains 8
  run "p$p-sghmc-8chains" --sampler sghmc --chains 8
done
