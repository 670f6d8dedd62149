#!/usr/bin/env python3
"""The first layer's zero-skipping products of two or more bnn binaries, interleaved.

    python3 bench/first_layer_ab.py ROUNDS BIN_A BIN_B [BIN ...]

Each round runs `BIN bench gemm --models mlp-100,mlp-400-400 -q` for every binary in
turn (A B A B …) and reads its `first_layer_zero_skipping` rows: the forward X·Wᵀ and the
weight gradient of 784→100 and 784→400 on real MNIST minibatches of 100 and 1000, two
threads. Prints per product the median µs of each binary and the median (min–max) of the
per-round ratios first ÷ last (above 1: the last binary is faster).
"""
import json
import statistics
import subprocess
import sys


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    rounds, bins = int(sys.argv[1]), sys.argv[2:]
    times = {b: {} for b in bins}
    for r in range(rounds):
        for b in bins:
            out = subprocess.run([b, "bench", "gemm", "--models", "mlp-100,mlp-400-400", "-q"],
                                 capture_output=True, text=True, check=True).stdout
            report = json.loads(out.strip().splitlines()[-1])
            for row in report["first_layer_zero_skipping"]:
                key = (row["product"], row["batch"])
                times[b].setdefault(key, []).append(row["skipping_us"])
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    first, last = bins[0], bins[-1]
    for key in times[first]:
        medians = " ".join(f"{statistics.median(times[b][key]):8.0f}" for b in bins)
        ratios = [a / z for a, z in zip(times[first][key], times[last][key])]
        print(f"{key[0]:>22} batch {key[1]:<5} {medians}  ratio "
              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})")


if __name__ == "__main__":
    main()
