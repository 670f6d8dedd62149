#!/usr/bin/env bash
# Trains four short runs on the built-in MNIST subset (MLP and LeNet, pixels scaled and
# standardised, one and two chains), evaluates each with `bnn eval`, and checks that
# scripts/eval_in_python.py, from the run's files alone, gets the same accuracy and the NLL
# within 1e-6 (docs/python.md). CI runs it; so can anyone:
#   PYTHON=path/to/python-with-numpy-and-safetensors BNN=target/release/bnn scripts/python-interop.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BNN="${BNN:-target/release/bnn}"
PYTHON="${PYTHON:-python3}"
BNN="$(cd "$(dirname "$BNN")" && pwd)/$(basename "$BNN")"
repo="$(pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The LeNet preset's [model] alone: its [train] section standardises the pixels.
sed -n '/^\[model\]/,/^$/p' models/lenet.toml > "$work/lenet-model.toml"
cd "$work"
export BNN_LOG=warn
common=(--dataset mnist-mini --offline --burnin 1 --thin 30 --no-progress)
"$BNN" train "${common[@]}" --epochs 2 --run-name mlp >/dev/null
"$BNN" train "${common[@]}" --epochs 2 --standardize --activation sigmoid --run-name mlp-std >/dev/null
"$BNN" train "${common[@]}" --epochs 2 --config "$repo/models/lenet.toml" --run-name lenet-std >/dev/null
"$BNN" train "${common[@]}" --epochs 2 --config lenet-model.toml --chains 2 --run-name lenet >/dev/null
status=0
for run in mlp mlp-std lenet-std lenet; do
    "$BNN" -q eval --run "checkpoints/$run" > "$run.json"
    "$PYTHON" "$repo/scripts/eval_in_python.py" --run "checkpoints/$run" --expect "$run.json" || status=1
done
exit $status
