#!/usr/bin/env bash
# The accuracy table of docs/BENCHMARKS.md for the MLPs (minutes on 2 cores): each run's
# command, seed, wall time and ensemble metrics as a Markdown row, with the CPU model,
# date and commit. Usage: bench/accuracy.sh [SEEDS] (default "0 1 2"); needs the full
# MNIST and Fashion-MNIST under BNN_DATA_DIR (default ../shared/data).
# The LeNet and ResNet rows take 20 minutes to hours each: their commands are in
# docs/BENCHMARKS.md, run them one by one.
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${1:-"0 1 2"}
export BNN_DATA_DIR="${BNN_DATA_DIR:-$(cd .. && pwd)/shared/data}"
BNN=${BNN:-target/release/bnn}
[ -x "$BNN" ] || cargo build --release
OUT=$(mktemp -d)
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
COMMIT=$(git rev-parse --short HEAD)
DATE=$(date -u +%F)
row() { # dataset, then the flags after --dataset
    local data=$1; shift
    for seed in $SEEDS; do
        local start end
        start=$(date +%s.%N)
        "$BNN" -q train --dataset "$data" --offline --out "$OUT" --seed "$seed" "$@" >"$OUT/summary.json"
        end=$(date +%s.%N)
        python3 - "$OUT/summary.json" "$start" "$end" "$data" "$seed" "$*" "$CPU" "$DATE" "$COMMIT" <<'PY'
import json, sys
s = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
start, end, data, seed, flags, cpu, date, commit = sys.argv[2:]
e = s["ensemble"]
cmd = f"bnn train --dataset {data} {flags} --seed {seed}".replace("  ", " ")
print(f"| {s['model_label']} | {data} | {s['sampler']['kind']} | {100*e['accuracy']:.2f}% | "
      f"{e['nll']:.4f} | {e['ece']:.4f} | {float(end)-float(start):.0f} s | {seed} | `{cmd}` | {cpu}, isa {s['isa']} | {date} | {commit} |")
PY
    done
}
echo "| model | data | sampler | ensemble acc | NLL | ECE | wall | seed | command | CPU | date | commit |"
echo "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | --- |"
row mnist --sampler sghmc
row mnist --sampler sgnht
row fashion-mnist --sampler sghmc
row fashion-mnist --sampler sgnht
SEEDS=${SEEDS%% *} row mnist --config models/mlp-400-400.toml --sampler msgnht
rm -rf "$OUT"
