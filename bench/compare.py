#!/usr/bin/env python3
"""Runs `bnn bench train` and bench/pytorch_reference.py alternately, several rounds, and
prints steps/s of both and the ratio of medians per configuration (JSON on the last line).

The PyTorch figure of a round is its faster mode (autograd or manual backward), so the
ratio is against the fastest PyTorch we could write.

With --torch-sampler sghmc, every bnn sampler is compared against PyTorch's SGHMC (for
mSGNHT and the splitting integrators, which the reference does not implement).

ResNets: --resnet 8,20 [--resnet-batch 128] times models/resnet{8,20}.toml as well (with
--hidden "" --cnn-batch "" only them).

Usage: python3 bench/compare.py [--rounds 3] [--python venv/bin/python] [--bnn target/release/bnn]
       [--sampler msgnht --integrator splitting --torch-sampler sghmc]
       [--hidden "" --cnn-batch "" --resnet 8,20 --resnet-batch 128]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--bnn", default=os.path.join(ROOT, "target", "release", "bnn"))
    ap.add_argument("--repeats", default="7")
    ap.add_argument("--hidden", default="100;400,400")
    ap.add_argument("--batch", default="100,1000")
    ap.add_argument("--cnn-batch", default="64")
    ap.add_argument("--resnet", default="", help='ResNet depths (models/resnetD.toml), e.g. "8,20"')
    ap.add_argument("--resnet-batch", default="128")
    ap.add_argument("--resnet-steps", default="20", help="ResNet updates per repeat at batch 100")
    ap.add_argument("--sampler", default="sghmc,sgnht")
    ap.add_argument("--integrator", default="euler", help="bnn's integrator (euler, splitting)")
    ap.add_argument("--torch-sampler", default=None,
                    help="compare every bnn sampler against this PyTorch sampler")
    args = ap.parse_args()
    shape = ["--hidden", args.hidden, "--batch", args.batch, "--cnn-batch", args.cnn_batch,
             "--repeats", args.repeats]
    torch_sampler = args.torch_sampler or args.sampler
    bnn_cmd = [args.bnn, "bench", "train", *shape, "--sampler", args.sampler,
               "--integrator", args.integrator]
    torch_cmd = [args.python, os.path.join(HERE, "pytorch_reference.py"), *shape,
                 "--sampler", torch_sampler, "--resnet", args.resnet,
                 "--resnet-batch", args.resnet_batch, "--resnet-steps", args.resnet_steps]
    bnn_cmds = [bnn_cmd] if (args.hidden.strip() or args.cnn_batch.strip()) else []
    depths = [d.strip() for d in args.resnet.split(",") if d.strip()]
    if depths:
        configs = [x for d in depths for x in ("--config", f"models/resnet{d}.toml")]
        bnn_cmds.append([args.bnn, "bench", "train", "--hidden", "", "--cnn-batch", "",
                         "--batch", args.resnet_batch, "--repeats", args.repeats,
                         "--steps", args.resnet_steps, *configs,
                         "--sampler", args.sampler, "--integrator", args.integrator])
    # The PyTorch row a bnn row is compared with.
    def torch_key(model, batch, sampler):
        return (model, batch, args.torch_sampler or sampler)

    bnn, torch, isa = {}, {}, set()
    for r in range(args.rounds):
        for row in (row for cmd in bnn_cmds for row in run_json(cmd)):
            isa.add(row.get("isa", "?"))
            bnn.setdefault((row["model"], row["batch"], row["sampler"]), []).append(
                row["steps_per_second"])
        best = {}
        for row in run_json(torch_cmd):
            key = (row["model"], row["batch"], row["sampler"])
            best[key] = max(best.get(key, 0.0), row["steps_per_second"])
        for key, v in best.items():
            torch.setdefault(key, []).append(v)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    rows = []
    print(f"bnn kernel path: {', '.join(sorted(isa))}; integrator {args.integrator}")
    print(f"{'model':24} {'batch':>5} {'sampler':7} {'vs torch':8} {'bnn steps/s':>12} "
          f"{'torch steps/s':>14} {'ratio':>6} {'ratio range':>12}")
    for key in sorted(bnn):
        tk = torch_key(*key)
        b, t = statistics.median(bnn[key]), statistics.median(torch[tk])
        per_round = [x / y for x, y in zip(bnn[key], torch[tk])]
        rows.append({"model": key[0], "batch": key[1], "sampler": key[2],
                     "integrator": args.integrator, "torch_sampler": tk[2],
                     "isa": sorted(isa),
                     "bnn_steps_per_second": b, "torch_steps_per_second": t, "ratio": b / t,
                     "round_ratios": per_round,
                     "bnn_rounds": bnn[key], "torch_rounds": torch[tk]})
        print(f"{key[0]:24} {key[1]:5} {key[2]:7} {tk[2]:8} {b:12.1f} {t:14.1f} {b / t:6.2f} "
              f"{min(per_round):5.2f}-{max(per_round):.2f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
