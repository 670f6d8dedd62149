#!/usr/bin/env python3
"""Markdown rows of the replica-exchange Fashion-MNIST table from the runs of
bench/replicas_fashion.sh. Usage: bench/replicas_table.py OUT_DIR"""
import json
import pathlib
import sys

out = pathlib.Path(sys.argv[1])
print("| p | method | ensemble acc | ensemble NLL | last-sample acc | gradient evals | "
      "wall s | swap rates after freeze (realised / mean g(ΔẼ)) | final ladder | round trips |")
print("|---|---|---|---|---|---|---|---|---|---|")


def cells(v):
    return "[" + ", ".join(f"{x:.2f}" for x in v) + "]"


def ladder_cells(v):
    return "[" + ", ".join(f"{x:.4f}" for x in v) + "]"


for p in ["0", "0.2", "0.3"]:
    for variant in ["renhd", "renhd-per-param", "reld", "sgnht", "sghmc",
                    "renhd-gauss", "renhd-per-param-gauss", "reld-gauss", "sgnht-gauss",
                    "sghmc-gauss", "sgnht-8chains-gauss", "sghmc-8chains-gauss",
                    "renhd-const", "sgnht-const", "renhd-const-gauss", "sgnht-const-gauss",
                    "sgnht-8chains", "sghmc-8chains"]:
        f = out / f"p{p}-{variant}" / "summary.json"
        if not f.exists():
            continue
        s = json.loads(f.read_text())
        rx = s.get("replica_exchange")
        rates = ladder = trips = ""
        if rx:
            rates = f"{cells(rx['swap_rates'])} / {cells(rx['expected_swap_rates'])}"
            ladder = ladder_cells(rx["ladder"]["temperatures"])
            trips = str(sum(rx["ladder"]["round_trips"]))
        last = s.get("last_sample") or {}
        print(f"| {p} | {variant} | {100 * s['ensemble']['accuracy']:.2f} | "
              f"{s['ensemble']['nll']:.4f} | {100 * last.get('accuracy', float('nan')):.2f} | "
              f"{s['steps']} | {s['train_seconds']:.0f} | {rates} | {ladder} | {trips} |")
