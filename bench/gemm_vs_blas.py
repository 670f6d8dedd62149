#!/usr/bin/env python3
"""`bnn bench gemm` against a BLAS on the same shapes, threads and machine, interleaved.

    python3 bench/gemm_vs_blas.py [--bnn target/release/bnn] [--rounds 5] [--threads 2]

Each round runs `bnn bench gemm` (its medians of --repeats, and the measured FMA peak),
then the same products through the BLAS: PyTorch's `torch.mm` (MKL on x86-64) when torch
imports, else NumPy's `matmul` (OpenBLAS in the pip wheels). Both are capped to
--threads. The forward products read W transposed in place (`x @ w.T`), as bnn does; the
weight gradient and input error are row-major products. For MKL capped to AVX2, set
`MKL_ENABLE_INSTRUCTIONS=AVX2` before running.

Prints per product the median GFLOP/s of each, bnn ÷ BLAS (median and min–max over
the rounds) and bnn's fraction of the measured peak; JSON on the last line.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def blas(threads):
    """(name, mm(m, n, k, transposed) -> seconds per product, median of 7)."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    try:
        import torch
        torch.set_num_threads(threads)
        name = f"torch {torch.__version__} ({'MKL' if torch.backends.mkl.is_available() else 'no MKL'})"

        def operands(m, n, k, transposed):
            a = torch.rand(m, k)
            b = torch.rand(n, k).t() if transposed else torch.rand(k, n)
            out = torch.empty(m, n)
            return lambda: torch.mm(a, b, out=out)
    except ImportError:
        import numpy as np
        cfg = np.__config__.CONFIG["Build Dependencies"]["blas"]
        name = f"numpy {np.__version__} ({cfg['name']} {cfg['version']})"

        def operands(m, n, k, transposed):
            rng = np.random.default_rng(0)
            a = rng.random((m, k), dtype=np.float32)
            b = rng.random((n, k), dtype=np.float32).T if transposed else \
                rng.random((k, n), dtype=np.float32)
            out = np.empty((m, n), dtype=np.float32)
            return lambda: np.matmul(a, b, out=out)

    def mm(m, n, k, transposed):
        f = operands(m, n, k, transposed)
        f()
        times = []
        for _ in range(7):
            reps = max(1, int(2e7 / (m * n * k)))
            start = time.perf_counter()
            for _ in range(reps):
                f()
            times.append((time.perf_counter() - start) / reps)
        return statistics.median(times)
    return name, mm


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bnn", default="target/release/bnn")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args()
    name, mm = blas(a.threads)
    env = dict(os.environ, RAYON_NUM_THREADS=str(a.threads))
    ours, theirs, peaks = {}, {}, []
    for r in range(a.rounds):
        out = subprocess.run([a.bnn, "bench", "gemm", "--repeats", str(a.repeats)], env=env,
                             check=True, capture_output=True, text=True).stdout
        report = json.loads(out)
        peaks.append(report["peak"])
        for row in report["products"]:
            key = (row["product"], row["batch"], row["m"], row["n"], row["k"], row["threads"])
            ours.setdefault(key, []).append(row["bnn_gflop_per_s"])
            transposed = row["product"].startswith("forward")
            secs = mm(row["m"], row["n"], row["k"], transposed)
            theirs.setdefault(key, []).append(2 * row["m"] * row["n"] * row["k"] / secs / 1e9)
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr, flush=True)
    # Each thread count's measured peak, median over the rounds.
    peak = {t: statistics.median(p["measured_gflop_per_s"] for rnd in peaks for p in rnd
                                 if p["threads"] == t)
            for t in sorted({p["threads"] for p in peaks[0]})}
    print(f"BLAS: {name}; bnn path {peaks[0][0]['isa']}; measured peak (GFLOP/s, median of "
          f"rounds) {', '.join(f'{t} thread(s) {g:.0f}' for t, g in peak.items())}")
    print("| product | batch | m×k×n | threads | bnn GFLOP/s | BLAS GFLOP/s | bnn ÷ BLAS "
          "(min–max) | bnn ÷ peak |")
    print("| --- | ---: | --- | ---: | ---: | ---: | --- | ---: |")
    rows = []
    for key in ours:
        what, batch, m, n, k, threads = key
        ratios = [o / t for o, t in zip(ours[key], theirs[key])]
        o, t = statistics.median(ours[key]), statistics.median(theirs[key])
        frac = o / peak.get(threads, float("nan"))
        print(f"| {what} | {batch} | {m}×{k}×{n} | {threads} | {o:.0f} | {t:.0f} | "
              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) | "
              f"{frac:.2f} |")
        rows.append({"product": what, "batch": batch, "m": m, "n": n, "k": k,
                     "threads": threads, "bnn_gflop_per_s": o, "blas_gflop_per_s": t,
                     "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                     "ratio_max": max(ratios), "fraction_of_peak": frac})
    print(json.dumps({"blas": name, "peak": peak, "products": rows}))


if __name__ == "__main__":
    main()
