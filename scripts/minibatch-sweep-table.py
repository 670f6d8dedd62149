#!/usr/bin/env python3
"""The Markdown table of the minibatch sweep's CSV rows (tests/suite/minibatch_posterior.rs,
`sweep`): per batch size, sampler and step multiple, over seeds 1-3, the per-coordinate
variance ratio (min-max over coordinates and seeds), the largest mean error, the run's
configurational temperature and the samples' exact one (ranges over seeds; none on the
logistic twin, whose ratios are against HMC's samples), how many seeds warned, and whether
the temperature and the variance ratios point the same way.

Direction: the variance ratios' is the side of 1 of their larger excursion (the largest
ratio's distance above 1 against the smallest's below); the temperature's is the side of 1
its median over the seeds is on. Rows where every ratio is within [0.85, 1.15] (the
default-suite test's tolerance) and the temperature within [0.9, 1.1] (the warning's
band) are "in band" for both: there is no direction to agree on.

    python3 scripts/minibatch-sweep-table.py target/minibatch-sweep [100,32 | logistic]
"""
import csv, sys, os
from collections import defaultdict

out = sys.argv[1] if len(sys.argv) > 1 else "target/minibatch-sweep"
rows = defaultdict(list)
order = []
for batch in sys.argv[2].split(",") if len(sys.argv) > 2 else ("100", "32"):
    path = os.path.join(out, f"sweep-{batch}.csv")
    for r in csv.reader(open(path)):
        key = (r[2], r[0], float(r[1]))
        if key not in rows:
            order.append(key)
        rows[key].append(r)

def rng(v, fmt="{:.2f}"):
    lo, hi = min(v), max(v)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}–{fmt.format(hi)}"

print("| batch | sampler | step | variance ratio | max mean error (sd) | run θ·∇Ũ/D | samples' θ·∇U/D | warned | direction |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
# Rows in the sweep's order (batch, sampler, step), whatever order the runs were made in.
SAMPLERS = ["sgld", "sghmc", "sghmc-s", "sghmc-b", "sgnht-e", "sgnht-s", "msgnht-e", "msgnht-s"]
batches = list(dict.fromkeys(k[0] for k in order))
order.sort(key=lambda k: (batches.index(k[0]), SAMPLERS.index(k[1]) if k[1] in SAMPLERS else 99, k[2]))
agree = total = 0
for key in order:
    batch, name, mult = key
    ok = [r for r in rows[key] if r[9] != "diverged"]
    diverged = len(rows[key]) - len(ok)
    if not ok:
        print(f"| {batch} | {name} | {mult:g}× | diverged ({diverged}/{len(rows[key])}) | | | | | |")
        continue
    lo = [float(r[4]) for r in ok]; hi = [float(r[5]) for r in ok]
    err = [float(r[6]) for r in ok]; run = [float(r[7]) for r in ok]
    ex = [float(r[8]) for r in ok if r[8]]  # (none on the logistic twin: no exact gradient)
    warned = sum(r[9] == "true" for r in ok)
    mn, mx = min(lo), max(hi)
    t = sorted(run)[len(run) // 2]
    if mx <= 1.15 and mn >= 0.85 and 0.9 <= t <= 1.1:
        d = "in band"; same = True
    else:
        ratios = "hot" if (mx - 1) > (1 - mn) else "cold"
        temp = "hot" if t > 1 else "cold"
        same = ratios == temp
        d = f"{ratios} / {temp}" + ("" if same else " ✗")
    agree += same; total += 1
    note = f" ({diverged} diverged)" if diverged else ""
    print(f"| {batch} | {name} | {mult:g}× | {mn:.2f}–{mx:.2f}{note} | {max(err):.2f} | {rng(run)} | {rng(ex) if ex else '-'} | {warned}/{len(ok)} | {d} |")
print(f"\nDirection agrees on {agree} of {total} rows.")
