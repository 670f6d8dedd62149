#!/usr/bin/env python3
"""`bnn bench gemm` against a BLAS on the same shapes, threads and machine, interleaved.

    python3 bench/gemm_vs_blas.py [--bnn target/release/bnn] [--rounds 5] [--threads 2]

Each round runs `bnn bench gemm` (its medians of --repeats, and the measured FMA peak),
then the same products through the BLAS: with `--blas mkl`, MKL's `cblas_sgemm` called
through ctypes (`pip install mkl` puts `libmkl_rt.so` beside the interpreter); otherwise
PyTorch's `torch.mm` (MKL on x86-64) when torch imports, else NumPy's `matmul` (OpenBLAS
in the pip wheels). Both run on the threads bnn's product had in the step (--threads,
or one for the ResNet's, whose halves of the minibatch run on a thread each; NumPy's
BLAS keeps --threads). The products are the census of the
models' steps that `bnn bench gemm` takes, with the operand layouts the passes use (an
operand marked transposed is read in place, as bnn reads it); a direct convolution is
set against the BLAS on its im2col product, without the im2col. For MKL capped to AVX2,
set `MKL_ENABLE_INSTRUCTIONS=AVX2` before running.

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


def mkl_operands():
    """(name, operands) for MKL's cblas_sgemm through ctypes."""
    import ctypes
    import ctypes.util
    import numpy as np
    here = os.path.join(sys.prefix, "lib", "libmkl_rt.so.3")
    lib = ctypes.CDLL(here if os.path.exists(here) else ctypes.util.find_library("mkl_rt"))
    buf = ctypes.create_string_buffer(256)
    lib.MKL_Get_Version_String(buf, ctypes.c_int(256))
    isa = os.environ.get("MKL_ENABLE_INSTRUCTIONS", "unrestricted")
    name = f"{buf.value.decode().strip()} (cblas_sgemm, instructions {isa})"
    f32p = ctypes.POINTER(ctypes.c_float)
    lib.cblas_sgemm.restype = None
    lib.cblas_sgemm.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, f32p, ctypes.c_int,
                                                     f32p, ctypes.c_int, ctypes.c_float,
                                                     f32p, ctypes.c_int]

    def operands(m, n, k, lhs_t, rhs_t, threads):
        lib.MKL_Set_Num_Threads(ctypes.c_int(threads))
        rng = np.random.default_rng(0)
        # An operand marked transposed is the transpose of a row-major matrix, read in
        # place, as bnn reads it (the forward's W, the weight gradient's Δ).
        a = rng.random((k, m) if lhs_t else (m, k), dtype=np.float32)
        b = rng.random((n, k) if rhs_t else (k, n), dtype=np.float32)
        out = np.empty((m, n), dtype=np.float32)
        ptr = lambda x: x.ctypes.data_as(f32p)
        args = (101, 112 if lhs_t else 111, 112 if rhs_t else 111, m, n, k, 1.0, ptr(a),
                m if lhs_t else k, ptr(b), k if rhs_t else n, 0.0, ptr(out), n)
        return lambda: lib.cblas_sgemm(*args)
    return name, operands


def blas(threads, which):
    """(name, mm(m, n, k, lhs_t, rhs_t, threads) -> seconds per product, median of 7)."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    name, operands = mkl_operands() if which == "mkl" else torch_or_numpy()

    def mm(m, n, k, lhs_t, rhs_t, threads):
        f = operands(m, n, k, lhs_t, rhs_t, threads)
        # A warm-up of 0.1 s: MKL's first calls of a shape ran at a third of its rate.
        start = time.perf_counter()
        while time.perf_counter() - start < 0.1:
            f()
        times = []
        for _ in range(7):
            reps = max(1, int(1e8 / (m * n * k)))
            start = time.perf_counter()
            for _ in range(reps):
                f()
            times.append((time.perf_counter() - start) / reps)
        return statistics.median(times)
    return name, mm


def torch_or_numpy():
    """(name, operands) for torch.mm where torch imports, else numpy.matmul."""
    try:
        import torch
        name = f"torch {torch.__version__} ({'MKL' if torch.backends.mkl.is_available() else 'no MKL'})"

        def operands(m, n, k, lhs_t, rhs_t, threads):
            torch.set_num_threads(threads)
            a = torch.rand(k, m).t() if lhs_t else torch.rand(m, k)
            b = torch.rand(n, k).t() if rhs_t else torch.rand(k, n)
            out = torch.empty(m, n)
            return lambda: torch.mm(a, b, out=out)
    except ImportError:
        import numpy as np
        cfg = np.__config__.CONFIG["Build Dependencies"]["blas"]
        name = f"numpy {np.__version__} ({cfg['name']} {cfg['version']})"

        def operands(m, n, k, lhs_t, rhs_t, threads):
            # (NumPy's BLAS keeps the thread count it started with.)
            rng = np.random.default_rng(0)
            a = rng.random((k, m), dtype=np.float32).T if lhs_t else \
                rng.random((m, k), dtype=np.float32)
            b = rng.random((n, k), dtype=np.float32).T if rhs_t else \
                rng.random((k, n), dtype=np.float32)
            out = np.empty((m, n), dtype=np.float32)
            return lambda: np.matmul(a, b, out=out)
    return name, operands


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bnn", default="target/release/bnn")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--models", default="",
                    help="bnn bench gemm --models (default: all)")
    ap.add_argument("--min-macs", type=int, default=10**6,
                    help="leave out products of fewer multiply-adds (the 10-class heads)")
    ap.add_argument("--blas", choices=["auto", "mkl"], default="auto",
                    help="mkl: MKL's cblas_sgemm through ctypes; auto: torch, else numpy")
    a = ap.parse_args()
    name, mm = blas(a.threads, a.blas)
    env = dict(os.environ, RAYON_NUM_THREADS=str(a.threads))
    ours, theirs, peaks = {}, {}, []
    for r in range(a.rounds):
        cmd = [a.bnn, "bench", "gemm", "--repeats", str(a.repeats)]
        if a.models:
            cmd += ["--models", a.models]
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        report = json.loads(out)
        peaks.append(report["peak"])
        blas_round = {}
        for row in report["products"]:
            if row["m"] * row["n"] * row["k"] < a.min_macs:
                continue
            key = (row["model"], row["batch"], row["product"], row["m"], row["n"], row["k"],
                   row["threads"])
            ours.setdefault(key, []).append(row["bnn_gflop_per_s"])
            # A direct convolution against the BLAS on its im2col product (im2col itself
            # not timed).
            # On the threads bnn's product had in the step: one for the ResNet's, whose
            # halves of the minibatch run on a thread each.
            dense = (row["m"], row["n"], row["k"], row["lhs"] == "transposed",
                     row["rhs"] == "transposed", row["threads"])
            if dense not in blas_round:
                blas_round[dense] = 2 * row["m"] * row["n"] * row["k"] / mm(*dense) / 1e9
            theirs.setdefault(key, []).append(blas_round[dense])
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr, flush=True)
    # Each thread count's measured peak, median over the rounds.
    peak = {t: statistics.median(p["measured_gflop_per_s"] for rnd in peaks for p in rnd
                                 if p["threads"] == t)
            for t in sorted({p["threads"] for p in peaks[0]})}
    print(f"BLAS: {name}; bnn path {peaks[0][0]['isa']}; measured peak (GFLOP/s, median of "
          f"rounds) {', '.join(f'{t} thread(s) {g:.0f}' for t, g in peak.items())}")
    print("| model | batch | product | m×k×n | threads | bnn GFLOP/s | BLAS GFLOP/s | "
          "bnn ÷ BLAS (min–max) | bnn ÷ peak |")
    print("| --- | ---: | --- | --- | ---: | ---: | ---: | --- | ---: |")
    rows = []
    for key in ours:
        model, batch, what, m, n, k, threads = key
        ratios = [o / t for o, t in zip(ours[key], theirs[key])]
        o, t = statistics.median(ours[key]), statistics.median(theirs[key])
        frac = o / peak.get(threads, float("nan"))
        print(f"| {model} | {batch} | {what} | {m}×{k}×{n} | {threads} | {o:.0f} | {t:.0f} | "
              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) | "
              f"{frac:.2f} |")
        rows.append({"model": model, "product": what, "batch": batch, "m": m, "n": n, "k": k,
                     "threads": threads, "bnn_gflop_per_s": o, "blas_gflop_per_s": t,
                     "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                     "ratio_max": max(ratios), "fraction_of_peak": frac})
    print(json.dumps({"blas": name, "peak": peak, "products": rows}))


if __name__ == "__main__":
    main()
