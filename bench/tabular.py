#!/usr/bin/env python3
"""The tables' acceptance figures: `bnn train --csv` on the shared tabular sets over
several seeded splits, beside a linear ridge baseline computed here (diabetes).

    python3 bench/tabular.py [--bnn target/release/bnn] [--data $BNN_DATA_DIR/tabular]
                             [--seeds 0,1,2,3,4] [--only diabetes,breast-cancer,digits,friedman]

Prints one Markdown table per data set (mean ± sd over the seeds) and the raw figures as
JSON on the last line. Pure Python (no numpy): the ridge solves its (d+1)×(d+1) normal
equations by Gauss–Jordan elimination.
"""
import argparse
import json
import math
import os
import random
import statistics
import subprocess
import tempfile


def run_bnn(bnn, out, name, args):
    cmd = [bnn, "train", "--out", out, "--run-name", name, "--no-progress"] + args
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "BNN_LOG": "warn"})
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: {res.stderr.strip()}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def read_csv(path, target):
    with open(path) as f:
        header = f.readline().strip().split(",")
        t = header.index(target)
        rows = [list(map(float, line.split(","))) for line in f if line.strip()]
    x = [[v for j, v in enumerate(r) if j != t] for r in rows]
    y = [r[t] for r in rows]
    return x, y


def solve(a, b):
    """Solves a·w = b (a small dense system) by Gauss–Jordan with partial pivoting."""
    n = len(a)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                m[r] = [vr - f * vc for vr, vc in zip(m[r], m[c])]
    return [m[i][n] / m[i][i] for i in range(n)]


def ridge(train_x, train_y, test_x, test_y, lam=1.0):
    """Ridge on standardised features (the intercept unpenalised), σ² from the training
    residuals (n − d − 1 degrees of freedom); the predictive N(ŷ, σ²(1 + xᵀA⁻¹x))."""
    d = len(train_x[0])
    mean = [statistics.fmean(c) for c in zip(*train_x)]
    sd = [statistics.pstdev(c) or 1.0 for c in zip(*train_x)]
    z = lambda rows: [[1.0] + [(v - m) / s for v, m, s in zip(r, mean, sd)] for r in rows]
    zt, zs = z(train_x), z(test_x)
    a = [[sum(r[i] * r[j] for r in zt) + (lam if i == j and i > 0 else 0.0) for j in range(d + 1)] for i in range(d + 1)]
    w = solve(a, [sum(r[i] * y for r, y in zip(zt, train_y)) for i in range(d + 1)])
    pred = lambda r: sum(wi * ri for wi, ri in zip(w, r))
    sse = sum((y - pred(r)) ** 2 for r, y in zip(zt, train_y))
    var = sse / (len(train_y) - d - 1)
    nll, sq = 0.0, 0.0
    for r, y in zip(zs, test_y):
        lev = sum(ri * vi for ri, vi in zip(r, solve(a, r)))
        v = var * (1.0 + lev)
        e = y - pred(r)
        sq += e * e
        nll += 0.5 * (math.log(2 * math.pi * v) + e * e / v)
    return {"rmse": math.sqrt(sq / len(test_y)), "nll": nll / len(test_y)}




def mean_sd(values):
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values) if len(values) > 1 else 0:.3f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bnn", default="target/release/bnn")
    ap.add_argument("--data", default=os.path.join(os.environ.get("BNN_DATA_DIR", "../shared/data"), "tabular"))
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--only", default="diabetes,breast-cancer,digits,friedman")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    only = a.only.split(",")
    out = tempfile.mkdtemp(prefix="bnn-tabular-")
    results = {}
    if "diabetes" in only:
        path = os.path.join(a.data, "diabetes.csv")
        x, y = read_csv(path, "progression")
        rows = []
        for s in seeds:
            summary = run_bnn(a.bnn, out, f"diabetes-{s}", ["--csv", path, "--target", "progression", "--seed", str(s)])
            manifest = json.load(open(os.path.join(out, f"diabetes-{s}", "run.json")))
            test = set(manifest["table"]["test_rows"])
            tr = [i for i in range(len(y)) if i not in test]
            te = sorted(test)
            base = ridge([x[i] for i in tr], [y[i] for i in tr], [x[i] for i in te], [y[i] for i in te])
            rows.append({"seed": s, "bnn": summary["regression"], "ridge": base, "seconds": summary["train_seconds"]})
        results["diabetes"] = rows
        print("\n### diabetes (80/20 split, seeds %s)\n" % a.seeds)
        print("| model | test RMSE | test NLL | 95% coverage |\n| --- | --- | --- | --- |")
        print(f"| bnn SGHMC ensemble | {mean_sd([r['bnn']['rmse'] for r in rows])} | {mean_sd([r['bnn']['nll'] for r in rows])} | {mean_sd([r['bnn']['coverage'][2] for r in rows])} |")
        print(f"| ridge (λ = 1) | {mean_sd([r['ridge']['rmse'] for r in rows])} | {mean_sd([r['ridge']['nll'] for r in rows])} | |")
    for name, file, target in [("breast-cancer", "breast-cancer.csv", "malignant_is_0"), ("digits", "digits-8x8.csv", "digit")]:
        if name not in only:
            continue
        path = os.path.join(a.data, file)
        rows = []
        for s in seeds:
            summary = run_bnn(a.bnn, out, f"{name}-{s}", ["--csv", path, "--target", target, "--seed", str(s)])
            rows.append({"seed": s, "ensemble": summary["ensemble"], "last_sample": summary["last_sample"], "seconds": summary["train_seconds"]})
        results[name] = rows
        print(f"\n### {name} (80/20 split, seeds {a.seeds})\n")
        print("| | accuracy | NLL | ECE |\n| --- | --- | --- | --- |")
        for k in ["ensemble", "last_sample"]:
            print(f"| {k} | {mean_sd([r[k]['accuracy'] for r in rows])} | {mean_sd([r[k]['nll'] for r in rows])} | {mean_sd([r[k]['ece'] for r in rows])} |")
    if "friedman" in only:
        train, test = (os.path.join(a.data, f"friedman1-{p}.csv") for p in ("train", "test"))
        rows = []
        for sampler in ["sghmc", "sgnht", "sgd"]:
            for s in seeds[:3]:
                summary = run_bnn(a.bnn, out, f"friedman-{sampler}-{s}", ["--csv", train, "--test-csv", test, "--target", "y", "--hidden", "50,50", "--sampler", sampler, "--seed", str(s)])
                rows.append({"sampler": sampler, "seed": s, "ensemble": summary["regression"], "last_sample": summary["regression_last_sample"], "seconds": summary["train_seconds"]})
        results["friedman"] = rows
        print(f"\n### Friedman #1 (MLP 10-50-50-1, seeds {seeds[:3]})\n")
        print("| sampler | | RMSE | NLL | 50% | 90% | 95% coverage | seconds |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
        for sampler in ["sghmc", "sgnht", "sgd"]:
            for k in ["ensemble", "last_sample"]:
                rs = [r for r in rows if r["sampler"] == sampler]
                cov = lambda q: mean_sd([r[k]["coverage"][q] for r in rs])
                print(f"| {sampler} | {k} | {mean_sd([r[k]['rmse'] for r in rs])} | {mean_sd([r[k]['nll'] for r in rs])} | {cov(0)} | {cov(1)} | {cov(2)} | {statistics.fmean(r['seconds'] for r in rs):.0f} |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
