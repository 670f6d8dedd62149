#!/usr/bin/env python3
"""Whole training runs timed wall to wall (docs/BENCHMARKS.md, "GPU"): by default the
default MNIST run (`bnn train --dataset mnist --sampler sgnht`: 784-100-10, 50 epochs,
through the step plan on CUDA) and the ResNet-20 Fashion-MNIST preset
(`--config models/resnet20.toml --dataset fashion-mnist`: four chains of 20 epochs, on
candle). Each run is stopped at --limit seconds; a stopped run is reported as such, with
the epochs its chains finished and their mean seconds from metrics.jsonl, so that no row
claims a whole run it did not finish. Prints one Markdown table (and JSON with --json).

    bench/gpu_runs.py --bnn PATH [--device cuda] [--limit 150] [--out DIR] [--only NAME]

scripts/gpu-runs.sh runs it on a GPU machine from a bundle; on the CPU it runs the same
commands (`--device cpu`), which is how it is tried without a GPU.
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

RUNS = {
    "mnist-default": ["--dataset", "mnist", "--sampler", "sgnht"],
    "resnet20-fmnist": ["--config", "models/resnet20.toml", "--dataset", "fashion-mnist"],
}


def epochs_done(run_dir):
    """Per chain's metrics.jsonl: the epoch lines written and their seconds."""
    done = []
    pattern = os.path.join(run_dir, "**", "metrics.jsonl")
    for path in sorted(glob.glob(pattern, recursive=True)):
        with open(path) as f:
            lines = [json.loads(l) for l in f if l.strip()]
        seconds = [l["seconds"] for l in lines if "seconds" in l]
        done.append((len(lines), sum(seconds)))
    return done


def run_one(bnn, name, args, device, limit, out):
    run_dir = os.path.join(out, name)
    cmd = [bnn, "train", *args, "--device", device, "--no-progress", "--quiet"]
    cmd += ["--out", out, "--run-name", name]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
        rc, stderr = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as e:
        rc = None
        stderr = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    wall = time.monotonic() - t0
    row = {"run": name, "command": "bnn train " + " ".join(args + ["--device", device]),
           "wall_seconds": round(wall, 1), "finished": rc == 0}
    summary = os.path.join(run_dir, "summary.json")
    if rc == 0 and os.path.exists(summary):
        with open(summary) as f:
            s = json.load(f)
        row.update(path=s.get("backward_used"), executor=s.get("executor"),
                   samples=s.get("samples"), accuracy=s["ensemble"]["accuracy"],
                   nll=s["ensemble"]["nll"], steps_per_second=s.get("steps_per_second"))
    elif rc is not None:
        row["error"] = (stderr.strip().splitlines() or ["exit %d" % rc])[-1]
    done = epochs_done(run_dir)
    row["epochs_per_chain"] = [e for e, _ in done]
    row["seconds_per_epoch"] = [round(s / e, 2) if e else None for e, s in done]
    return row


def table(rows):
    out = ["| run | finished | wall s | path | epochs per chain | s per epoch | ensemble acc | NLL |",
           "| --- | --- | ---: | --- | --- | --- | ---: | ---: |"]
    for r in rows:
        fin = "yes" if r["finished"] else ("error: " + r["error"] if "error" in r else "stopped at the limit")
        path = r.get("path") or "-"
        if r.get("executor"):
            path += " (%s)" % r["executor"]
        acc = "%.4f" % r["accuracy"] if "accuracy" in r else "-"
        nll = "%.6f" % r["nll"] if "nll" in r else "-"
        out.append("| %s | %s | %.1f | %s | %s | %s | %s | %s |" % (
            r["run"], fin, r["wall_seconds"], path, r["epochs_per_chain"],
            r["seconds_per_epoch"], acc, nll))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bnn", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--limit", type=float, default=150.0, help="seconds for each run")
    ap.add_argument("--out", default=None, help="run folders (default: a new temporary one)")
    ap.add_argument("--only", action="append", choices=sorted(RUNS), help="a run by name")
    ap.add_argument("--json", action="store_true", help="also print the rows as JSON")
    a = ap.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="gpu-runs-")
    rows = [run_one(a.bnn, name, RUNS[name], a.device, a.limit, out)
            for name in (a.only or list(RUNS))]
    print(table(rows))
    if a.json:
        print(json.dumps(rows))
    # A run that failed (not one stopped at the limit) fails the script.
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
