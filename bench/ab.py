#!/usr/bin/env python3
"""Interleaved A/B of `bnn bench train` between two bnn binaries: rounds A B A B …, each
round one `bnn bench train` per binary (its own medians of --repeats), then per
configuration the median of the B/A ratios of steps per second and their spread.
Usage: bench/ab.py A_BIN B_BIN [--rounds 5] [bench-train flags, e.g. --batch 100]."""
import argparse
import json
import statistics
import subprocess


def bench(binary, extra):
    out = subprocess.run([binary, "bench", "train", *extra], check=True,
                         capture_output=True, text=True).stdout
    rows = json.loads(out)
    return {(r["model"], r["batch"], r["sampler"]): r["steps_per_second"] for r in rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rounds", type=int, default=5)
    args, args.extra = ap.parse_known_args()
    ratios, a_all, b_all = {}, {}, {}
    for r in range(args.rounds):
        a = bench(args.a, args.extra)
        b = bench(args.b, args.extra)
        for key in a:
            ratios.setdefault(key, []).append(b[key] / a[key])
            a_all.setdefault(key, []).append(a[key])
            b_all.setdefault(key, []).append(b[key])
        print(f"round {r + 1}/{args.rounds}: B/A " + " ".join(
            f"{b[k] / a[k]:.3f}" for k in a), flush=True)
    # The best round of each is the least disturbed by other work on a shared machine.
    print("model | batch | sampler | A steps/s (median) | B steps/s (median) | B/A median | "
          "B/A min–max | B/A of the best rounds")
    for key, rs in ratios.items():
        print(f"{key[0]} | {key[1]} | {key[2]} | {statistics.median(a_all[key]):.1f} | "
              f"{statistics.median(b_all[key]):.1f} | {statistics.median(rs):.3f} | "
              f"{min(rs):.3f}–{max(rs):.3f} | {max(b_all[key]) / max(a_all[key]):.3f}")


if __name__ == "__main__":
    main()
