#!/usr/bin/env python3
"""`bnn` on one GPU beside the same SGHMC step in PyTorch and JAX, K chains at once, in
one interleaved run: per round, every row is timed once with each program in turn
(bnn through the step plan, bnn through candle, PyTorch eager, PyTorch CUDA graph, JAX
jit), so that a slow minute of a shared machine falls on all of them. `bnn` is
`--backward auto` (on CUDA an MLP runs through the step plan: its whole update a fixed
list of launches replayed as CUDA graphs; a ResNet through candle); `bnn-candle` is
`--backward autograd`, candle's op-by-op path (MLP rows only: for a ResNet it is `bnn`). Prints one table (chain-steps per second, median over the
rounds, and the spread) and, on the last line, JSON.

The step (bnn's defaults, Euler SGHMC in v-form, as bench/pytorch_reference.py): a
minibatch of B images per chain drawn from the training set held on the GPU as uint8 and
scaled to [0, 1]; g = (N/B) * grad sum CE + lambda * theta (lambda = 1, bnn's `--prior
gaussian --prior-std 1`); v <- (1 - alpha) v - eta g + sqrt(2 alpha eta) z; theta <- theta + v.
K chains are K independent parameter vectors with their own minibatches and noise:

- PyTorch eager: `torch.func.grad` of the loss w.r.t. one flat parameter vector, with
  `torch.func.vmap` over the chains for K > 1 (the "model ensembling" recipe);
- PyTorch CUDA graph: that step captured once with `torch.cuda.graph` (minibatch indices
  and noise drawn inside the graph) and replayed;
- JAX: the step under `jax.jit`, `jax.vmap` over the chains, `lax.scan` over the updates
  of a timed run (as BlackJAX runs its chains), parameters donated.

Networks (bnn's presets): mlp-100 (784-100-10), mlp-400-400 (784-400-400-10), and
resnet8 / resnet20 (models/resnet{8,20}.toml: FRN + TLU, swish, 16/32/64 channels), the
ResNets' parameters in bnn's order from bench/pytorch_reference.py.

Data: the built-in subset (data/mnist-mini, 10,000 real MNIST images), as the CPU
comparisons use.

Usage (on the GPU machine; scripts/gpu-bench.sh runs it):
  python3 bench/gpu_peers.py --bnn PATH/bnn [--rounds 3] [--rows mlp-100:100:1,64 ...]
  python3 bench/gpu_peers.py --device cpu --rows mlp-100:100:1,4 --rounds 1   # a dry run
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from reference_common import (  # noqa: E402
    FRICTION, FRN_EPSILON, MINI, PRIOR_PRECISION, STEP_SIZE, read_idx, resnet_layout)

# The rows: network, batch, chain counts.
DEFAULT_ROWS = ["mlp-100:100:1,64", "mlp-400-400:1000:1,16", "resnet8:128:1,8", "resnet20:128:1,8"]


def parse_rows(specs):
    rows = []
    for spec in specs:
        name, batch, ks = spec.split(":")
        for k in ks.split(","):
            rows.append((name, int(batch), int(k)))
    return rows


def widths_of(name):
    return [784] + [int(w) for w in name[len("mlp-"):].split("-")] + [10]


def resnet_blocks(name):
    depth = int(name[len("resnet"):])
    if (depth - 2) % 6:
        sys.exit(f"{name}: depth is not 6*blocks + 2")
    return (depth - 2) // 6


# ---------------------------------------------------------------------------------------
# Parameter layouts (shared by both frameworks): shapes in bnn's order and each tensor's
# initialisation (a fan-in for U(-1/sqrt(fan_in), 1/sqrt(fan_in)), or a constant).


def mlp_layout(widths):
    out = []
    for i, o in zip(widths[:-1], widths[1:]):
        out += [((o, i), i), ((o,), i)]
    return out, None


def layout_of(name):
    if name.startswith("mlp-"):
        return mlp_layout(widths_of(name))
    return resnet_layout(resnet_blocks(name))


def initial_theta(layout, chains, rng):
    parts = []
    for shape, init in layout:
        size = math.prod(shape)
        if isinstance(init, float):
            parts.append(np.full((chains, size), init, np.float32))
        else:
            bound = 1.0 / math.sqrt(init)
            parts.append(rng.uniform(-bound, bound, (chains, size)).astype(np.float32))
    return np.concatenate(parts, axis=1)


def load_data():
    images = read_idx(os.path.join(MINI, "train-images-idx3-ubyte.gz")).reshape(-1, 784)
    labels = read_idx(os.path.join(MINI, "train-labels-idx1-ubyte.gz")).astype(np.int32)
    return np.ascontiguousarray(images), labels


# ---------------------------------------------------------------------------------------
# PyTorch


class TorchRow:
    """One row's SGHMC step in PyTorch: eager, and (on CUDA) captured as a graph. The
    parameters are one tensor each, (K, ...) over the chains, as
    `torch.func.stack_module_state` gives them (a gradient w.r.t. views of one flat
    vector would add a zero-filled vector of every parameter per view in the backward),
    and the update runs over all of them at once with `torch._foreach_*`, as PyTorch's
    optimizers do."""

    def __init__(self, name, batch, chains, data, device):
        import torch
        import torch.nn.functional as F

        self.torch, self.F = torch, F
        self.dev = torch.device(device)
        layout, self.plan = layout_of(name)
        self.mlp = name.startswith("mlp-")
        flat = initial_theta(layout, chains, np.random.default_rng(0))
        self.params, at = [], 0
        for shape, _ in layout:
            size = math.prod(shape)
            part = flat[:, at : at + size].reshape((chains,) + shape)
            self.params.append(torch.from_numpy(np.ascontiguousarray(part)).to(self.dev))
            at += size
        self.v = [torch.randn_like(p) * math.sqrt(STEP_SIZE) for p in self.params]
        self.images = torch.from_numpy(data[0]).to(self.dev)
        self.labels = torch.from_numpy(data[1]).long().to(self.dev)
        self.batch, self.chains = batch, chains
        self.scale = self.images.shape[0] / batch
        grad = torch.func.grad(self.loss)
        self.grad = torch.func.vmap(grad) if chains > 1 else grad
        self.graph = None

    def logits(self, p, x):
        F, torch = self.F, self.torch
        if self.mlp:
            h, layers = x, len(p) // 2
            for k in range(layers):
                h = F.linear(h, p[2 * k], p[2 * k + 1])
                if k + 1 < layers:
                    h = torch.relu(h)
            return h

        from pytorch_reference import resnet_logits

        return resnet_logits(p, self.plan, x)

    def loss(self, params, x, y):
        return self.F.cross_entropy(self.logits(params, x), y, reduction="sum") * self.scale

    def step(self):
        torch = self.torch
        n_data = self.images.shape[0]
        idx = torch.randint(n_data, (self.chains, self.batch), device=self.dev)
        x = self.images[idx].float().div_(255.0)
        y = self.labels[idx]
        if self.chains > 1:
            g = self.grad(tuple(self.params), x, y)
        else:
            g = [t.unsqueeze(0) for t in self.grad(tuple(p[0] for p in self.params), x[0], y[0])]
        g = list(g)
        torch._foreach_add_(g, self.params, alpha=PRIOR_PRECISION)
        torch._foreach_mul_(self.v, 1.0 - FRICTION)
        torch._foreach_add_(self.v, g, alpha=-STEP_SIZE)
        z = [torch.randn_like(v) for v in self.v]
        torch._foreach_add_(self.v, z, alpha=math.sqrt(2.0 * FRICTION * STEP_SIZE))
        torch._foreach_add_(self.params, self.v)

    def capture(self):
        """The step as a CUDA graph: warmed up on a side stream, captured once."""
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.step()

    def run(self, steps, graph):
        torch = self.torch
        if graph and self.graph is None:
            self.capture()
        one = self.graph.replay if graph else self.step
        self.sync()
        t = time.perf_counter()
        for _ in range(steps):
            one()
        self.sync()
        secs = time.perf_counter() - t
        if not all(bool(torch.isfinite(p).all()) for p in self.params):
            sys.exit("the PyTorch chains diverged: the timing would not be of a real step")
        return steps * self.chains / secs

    def sync(self):
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------
# JAX


class JaxRow:
    """One row's SGHMC step in JAX: the parameters a list of arrays (K, ...) over the
    chains, the step under jit, vmap over chains, scan over a run's updates."""

    def __init__(self, name, batch, chains, data, steps):
        import jax
        import jax.numpy as jnp

        self.jax, self.jnp = jax, jnp
        layout, plan = layout_of(name)
        shapes = [s for s, _ in layout]
        mlp = name.startswith("mlp-")
        images = jnp.asarray(data[0])
        labels = jnp.asarray(data[1])
        n_data = images.shape[0]
        scale = n_data / batch

        def conv(x, w, stride, pad):
            return jax.lax.conv_general_dilated(
                x, w, (stride, stride), [(pad, pad), (pad, pad)],
                dimension_numbers=("NCHW", "OIHW", "NCHW"))

        def frn_tlu(z, gamma, beta, tau):
            nu2 = jnp.mean(z * z, axis=(2, 3), keepdims=True)
            y = z * jax.lax.rsqrt(nu2 + FRN_EPSILON) * gamma[None, :, None, None] + beta[None, :, None, None]
            return jnp.maximum(y, tau[None, :, None, None])

        def logits(p, x):
            if mlp:
                h, layers = x, len(p) // 2
                for k in range(layers):
                    h = h @ p[2 * k].T + p[2 * k + 1]
                    if k + 1 < layers:
                        h = jax.nn.relu(h)
                return h
            p = iter(p)
            h = x.reshape(-1, 1, 28, 28)
            h = jax.nn.silu(frn_tlu(conv(h, next(p), 1, 1), next(p), next(p), next(p)))
            for stride, project, *_ in plan:
                a = jax.nn.silu(frn_tlu(conv(h, next(p), stride, 1), next(p), next(p), next(p)))
                a = frn_tlu(conv(a, next(p), 1, 1), next(p), next(p), next(p))
                if project:
                    w, b = next(p), next(p)
                    s = conv(h, w, stride, 0) + b[None, :, None, None]
                else:
                    s = h
                h = jax.nn.silu(a + s)
            w, b = next(p), next(p)
            return jnp.mean(h, axis=(2, 3)) @ w.T + b

        def loss(theta, x, y):
            lp = jax.nn.log_softmax(logits(theta, x))
            return -jnp.sum(jnp.take_along_axis(lp, y[:, None], axis=1)) * scale

        grad = jax.vmap(jax.grad(loss))

        def step(carry, _):
            theta, v, key = carry
            key, k_idx, k_z = jax.random.split(key, 3)
            idx = jax.random.randint(k_idx, (chains, batch), 0, n_data)
            x = images[idx].astype(jnp.float32) / 255.0
            y = labels[idx]
            g = grad(theta, x, y)
            keys = jax.random.split(k_z, len(theta))
            noise = math.sqrt(2.0 * FRICTION * STEP_SIZE)
            v = [(1.0 - FRICTION) * vi - STEP_SIZE * (gi + PRIOR_PRECISION * ti)
                 + noise * jax.random.normal(ki, ti.shape)
                 for ti, vi, gi, ki in zip(theta, v, g, keys)]
            return ([ti + vi for ti, vi in zip(theta, v)], v, key), None

        def run(theta, v, key):
            (theta, v, key), _ = jax.lax.scan(step, (theta, v, key), None, length=steps)
            return theta, v, key

        self.run_jit = jax.jit(run, donate_argnums=(0, 1))
        rng = np.random.default_rng(0)
        flat = initial_theta(layout, chains, rng)
        self.theta, at = [], 0
        for shape in shapes:
            size = math.prod(shape)
            self.theta.append(jnp.asarray(flat[:, at : at + size].reshape((chains,) + shape)))
            at += size
        self.v = [jnp.asarray(rng.standard_normal(t.shape).astype(np.float32)) * math.sqrt(STEP_SIZE)
                  for t in self.theta]
        self.key = jax.random.PRNGKey(0)
        self.chains, self.steps = chains, steps
        # Compile (and warm up) before any timing.
        self.theta, self.v, self.key = self.run_jit(self.theta, self.v, self.key)
        jax.block_until_ready(self.theta)

    def run(self):
        t = time.perf_counter()
        self.theta, self.v, self.key = self.run_jit(self.theta, self.v, self.key)
        self.jax.block_until_ready(self.theta)
        secs = time.perf_counter() - t
        if not all(bool(self.jnp.isfinite(t).all()) for t in self.theta):
            sys.exit("the JAX chains diverged: the timing would not be of a real step")
        return self.steps * self.chains / secs


# ---------------------------------------------------------------------------------------
# bnn


def bnn_rate(exe, name, batch, chains, epochs, device, out, backward="auto"):
    """Chain-steps per second of the training step of `bnn train` (its summary's
    `steps_per_second`: gather, forward, backward and update, summed over the chains)."""
    model = (["--hidden", ",".join(str(w) for w in widths_of(name)[1:-1])]
             if name.startswith("mlp-") else
             ["--config", os.path.join(ROOT, "models", f"{name}.toml")])
    cmd = [exe, "train", "--dataset", "mnist-mini", "--offline", "--device", device,
           *model, "--batch-size", str(batch), "--chains", str(chains),
           "--sampler", "sghmc", "--integrator", "euler", "--step-size", str(STEP_SIZE),
           "--prior", "gaussian", "--prior-std", "1", "--epochs", str(epochs),
           "--burnin", str(epochs - 1), "--thin", "100000000", "--decay-at",
           "--backward", backward, "--no-progress", "--out", out,
           "--run-name", f"{name}-{batch}-{chains}-{backward}", "-q"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bnn failed ({' '.join(cmd)}): {done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])["steps_per_second"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bnn", help="the bnn binary (omit to time the peers only)")
    ap.add_argument("--rows", nargs="*", default=DEFAULT_ROWS,
                    help="NAME:BATCH:K1,K2 (names: mlp-W1-W2..., resnetD)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.5,
                    help="about how long each timed run of a peer lasts")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run")
    ap.add_argument("--peers", default="torch-eager,torch-graph,jax")
    args = ap.parse_args()
    peers = [p for p in args.peers.split(",") if p]
    rows = parse_rows(args.rows)
    data = load_data()
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            sys.exit("gpu_peers: PyTorch sees no CUDA device")
    if args.device != "cuda" and "torch-graph" in peers:
        peers.remove("torch-graph")  # CUDA graphs need CUDA
    results = {}  # (row, program) -> [chain-steps/s per round]
    torch_rows, jax_rows = {}, {}
    out = tempfile.mkdtemp(prefix="gpu-peers-")
    for r in range(args.rounds):
        for row in rows:
            name, batch, chains = row
            if args.bnn:
                mlp = name.startswith("mlp-")
                # The plan's MLP rows run 10 epochs (1,000 updates at batch 100): at
                # 20,000 updates/s, 3 would time 15 ms.
                results.setdefault((row, "bnn"), []).append(
                    bnn_rate(args.bnn, name, batch, chains, 10 if mlp else 2, args.device, out))
                if mlp:
                    results.setdefault((row, "bnn-candle"), []).append(
                        bnn_rate(args.bnn, name, batch, chains, 3, args.device, out, "autograd"))
            for peer in peers:
                if peer.startswith("torch"):
                    if row not in torch_rows:
                        torch_rows[row] = TorchRow(name, batch, chains, data, args.device)
                    t = torch_rows[row]
                    graph = peer == "torch-graph"
                    t.run(2, graph)  # warm-up (and capture)
                    probe = max(1, int(10 / chains))
                    rate = t.run(probe, graph)
                    steps = max(3, int(args.seconds * rate / chains))
                    rate = t.run(steps, graph)
                elif peer == "jax":
                    if row not in jax_rows:
                        # The scan's length is fixed at compilation: sized from a probe.
                        probe = JaxRow(name, batch, chains, data, 5)
                        rate = probe.run()
                        steps = max(5, int(args.seconds * rate / chains))
                        jax_rows[row] = JaxRow(name, batch, chains, data, steps)
                    rate = jax_rows[row].run()
                else:
                    sys.exit(f"unknown peer {peer}")
                results.setdefault((row, peer), []).append(rate)
            print(f"round {r + 1}/{args.rounds}: {name} b{batch} K={chains} done", file=sys.stderr)
    programs = (["bnn", "bnn-candle"] if args.bnn else []) + peers
    table = []
    header = "| network | batch | K | " + " | ".join(programs) + " |"
    lines = [header, "|" + " --- |" * (3 + len(programs))]
    for row in rows:
        cells, entry = [], {"network": row[0], "batch": row[1], "chains": row[2]}
        for p in programs:
            xs = results.get((row, p))
            if xs is None:
                cells.append("—")
                continue
            med = statistics.median(xs)
            entry[p] = {"median": med, "min": min(xs), "max": max(xs), "rounds": xs}
            cells.append(f"{med:,.0f} ({min(xs):,.0f}–{max(xs):,.0f})")
        table.append(entry)
        lines.append(f"| {row[0]} | {row[1]} | {row[2]} | " + " | ".join(cells) + " |")
    print("chain-steps per second, median of the rounds (min–max):")
    print("\n".join(lines))
    print(json.dumps({"rows": table, "rounds": args.rounds, "device": args.device}))


if __name__ == "__main__":
    main()
