#!/usr/bin/env bash
# The own-model example's step-size sweep: the ensemble accuracy after 6 epochs for each
# lr (= η·N, the step on the mean loss) on the MNIST subset (10,000 images) and on full
# MNIST (60,000), seeds 1-3. Prints one CSV row per run: dataset,lr,seed,accuracy,nll.
# Needs BNN_DATA_DIR with the MNIST files for `mnist`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --example own_model >&2
LRS=${LRS:-"0.03 0.06 0.12 0.24 0.48"}
SEEDS=${SEEDS:-"1 2 3"}
echo "dataset,lr,seed,accuracy,nll"
for dataset in mnist-mini mnist; do
  for lr in $LRS; do
    for seed in $SEEDS; do
      line=$(target/release/examples/own_model --dataset "$dataset" --lr "$lr" --seed "$seed" | grep '^20 samples\|^[0-9]* samples:' | tail -1)
      acc=$(sed -E 's/.*ensemble accuracy ([0-9.]+),.*/\1/' <<<"$line")
      nll=$(sed -E 's/.*ensemble accuracy [0-9.]+, NLL ([0-9.]+),.*/\1/' <<<"$line")
      echo "$dataset,$lr,$seed,$acc,$nll"
    done
  done
done
