#!/usr/bin/env bash
# The replica-exchange Fashion-MNIST table: RENHD (scalar and per-parameter thermostats), RELD,
# SGNHT and SGHMC on the tuned 784-100-10 MLP at label noise p, 50 epochs for the T = 1
# replica (M = 8, --ladder auto, N = 100), and SGNHT/SGHMC with 8 chains (the replicas'
# gradient evaluations). Runs already finished (summary.json present) are skipped, so the
# script can be stopped and started again.
# Usage: bench/replicas_fashion.sh OUT_DIR [RUN ...]   RUN: P/VARIANT, e.g. 0.2/renhd;
# default: every run, p = 0.2 first; renhd-const and sgnht-const (constant step size,
# burn-in 20), renhd-ladder (100 epochs, see below) and every VARIANT-gauss (Gaussian prior) only when named. BNN (default target/release/bnn) and BNN_DATA_DIR
# point at the binary and the data.
set -euo pipefail
out=${1:?usage: $0 OUT_DIR [P/VARIANT ...]}
shift
runs=("$@")
if [ ${#runs[@]} -eq 0 ]; then
  runs=(0.2/sgnht 0.2/sghmc 0.2/renhd 0.2/renhd-per-param 0.2/reld
    0/sgnht 0/sghmc 0/renhd 0.3/sgnht 0.3/sghmc 0.3/renhd
    0.2/sgnht-8chains 0.2/sghmc-8chains
    0/renhd-per-param 0/reld 0.3/renhd-per-param 0.3/reld
    0/sgnht-8chains 0/sghmc-8chains 0.3/sgnht-8chains 0.3/sghmc-8chains)
fi
bnn=${BNN:-target/release/bnn}
common=(--dataset fashion-mnist --offline --standardize --batch-size 200 --step-size 1e-6
  --no-progress -q --out "$out")
replicas=(--replicas 8 --ladder auto --exchange-every 100)
for run in "${runs[@]}"; do
  p=${run%%/*}
  variant=${run#*/}
  name="p$p-$variant"
  [ -f "$out/$name/summary.json" ] && continue
  # A variant ending in -gauss runs with a fixed Gaussian prior N(0, 1) instead of the
  # Gamma hyper-prior's Gibbs-sampled precisions.
  prior=()
  epochs=50
  base=$variant
  if [[ $variant == *-gauss ]]; then
    prior=(--prior gaussian)
    base=${variant%-gauss}
  fi
  case $base in
    renhd) flags=(--sampler renhd "${replicas[@]}") ;;
    renhd-per-param) flags=(--sampler renhd "${replicas[@]}" --replica-thermostat per-parameter) ;;
    reld) flags=(--sampler reld "${replicas[@]}") ;;
    # The ladder adapted over 20 epochs at a constant step size (no decay after it froze).
    renhd-const) flags=(--sampler renhd "${replicas[@]}" --decay-at --burnin 20) ;;
    # The ladder item: 25 epochs of adaptation at 6 exchange rounds per epoch (75 tries
    # per pair), then 75 frozen epochs (225 tries per pair, so that a realised rate's
    # standard error is about 0.03), constant step size.
    renhd-ladder)
      epochs=100
      flags=(--sampler renhd --replicas 8 --ladder auto --exchange-every 50 --decay-at --burnin 25) ;;
    # The same with 100 epochs of adaptation and 100 frozen: the 100-epoch run's rates
    # drifted after the freeze (one pair from 0.24 to 0 over epochs 25-67).
    renhd-ladder-long)
      epochs=200
      flags=(--sampler renhd --replicas 8 --ladder auto --exchange-every 50 --decay-at --burnin 100) ;;
    sgnht-const) flags=(--sampler sgnht --integrator euler --decay-at --burnin 20) ;;
    sgnht) flags=(--sampler sgnht --integrator euler) ;;
    sghmc) flags=(--sampler sghmc) ;;
    sgnht-8chains) flags=(--sampler sgnht --integrator euler --chains 8) ;;
    sghmc-8chains) flags=(--sampler sghmc --chains 8) ;;
    *) echo "unknown variant $variant" >&2; exit 2 ;;
  esac
  echo "$(date -u +%FT%TZ) start $name" >&2
  "$bnn" train "${common[@]}" --epochs "$epochs" --permute-labels "$p" --run-name "$name" "${flags[@]}" \
    ${prior[@]+"${prior[@]}"} >/dev/null
  echo "$(date -u +%FT%TZ) done $name" >&2
done
