#!/usr/bin/env bash
# The JSON `bnn sample` prints for each sampler on a fixed set of runs (seed 2), one file
# per run, so that a refactor can show it changes no number: run it with the binary
# before and after, then `diff -r BEFORE AFTER`.
#   scripts/sample-fingerprints.sh BNN_BINARY OUT_DIR
set -euo pipefail
bnn=${1:?usage: $0 BNN_BINARY OUT_DIR}
out=${2:?usage: $0 BNN_BINARY OUT_DIR}
mkdir -p "$out"
common=(--seed 2 --steps 100000 --burnin 10000 -q)
run() {
    local name=$1
    shift
    "$bnn" sample "$@" "${common[@]}" >"$out/$name.json"
}
run sghmc --potential double-well --sampler sghmc
run sgnht-3chains --potential double-well --sampler sgnht --chains 3
run msgnht --potential double-well --sampler msgnht
run renhd --potential gmm5 --sampler renhd
run reld --potential gmm5 --sampler reld
run sgld --potential double-well --sampler sgld
run sgnht-euler-gaussian --potential gaussian --sampler sgnht --integrator euler
sha256sum "$out"/*.json
