#!/usr/bin/env bash
# The floors as Cargo enforces them (docs/DESIGN.md, "Floors"):
# 1. the library crates build alone, without the command line's dependencies;
# 2. their dependency trees hold none of clap, plotters, image, indicatif, ureq;
# 3. a `use bnn_run::…` planted in bnn-core fails to build (bnn-core cannot see the floor
#    above it), and the file is restored whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo check --release -p bnn-kernels -p bnn-core -p bnn-run
for p in bnn-kernels bnn-core bnn-run; do
    bad=$(cargo tree -p "$p" -e normal --prefix none | grep -E '^(clap|plotters|image|indicatif|ureq) ' | sort -u || true)
    if [ -n "$bad" ]; then
        echo "floors: $p depends on $bad" >&2
        exit 1
    fi
done

lib=crates/bnn-core/src/lib.rs
saved=$(mktemp)
cp "$lib" "$saved"
trap 'cp "$saved" "$lib"; rm -f "$saved"' EXIT
printf '\n#[allow(unused_imports)]\nuse bnn_run::train;\n' >> "$lib"
if out=$(cargo check --release -p bnn-core --message-format short 2>&1); then
    echo "floors: bnn-core built with a planted \`use bnn_run::train\`" >&2
    exit 1
fi
grep -q "bnn_run" <<<"$out" || { echo "floors: the planted import failed for another reason:" >&2; echo "$out" >&2; exit 1; }
echo "floors: ok (planted import refused: $(grep -m1 'error' <<<"$out"))"
