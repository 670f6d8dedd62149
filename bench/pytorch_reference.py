#!/usr/bin/env python3
"""PyTorch reference for `bnn bench train`: the same MLPs, the same LeNet-style CNN
(models/lenet.toml) and the same SGHMC / SGNHT
updates (Euler, v-form: eta = h^2, v = p*h, alpha = xi*h, a = A*h), hand-written in
PyTorch eager, as fast as we can honestly make it:

- all parameters in one flat vector (theta), with views for each W and b; the
  momentum, the gradient and a noise buffer flat and pre-allocated; updates in place;
- two ways to get the gradient, both timed (`--mode both`, the default) so the faster
  one is the reference:
  * `autograd`: torch.autograd.grad of the scaled cross-entropy w.r.t. the flat
    parameter leaf (the input needs no gradient, so none is computed);
  * `manual`: forward and backward written out with torch.addmm/mm into pre-allocated
    buffers (out=...), no autograd at all;
- the CNN (conv 5x5, 6 channels -> relu -> max-pool 2 -> conv 5x5, 16 -> relu ->
  max-pool 2 -> 120 -> 84 -> 10) gets its gradient by autograd w.r.t. the flat
  parameter leaf (PyTorch's convolutions are oneDNN/MKL kernels; a hand-written
  convolution backward in eager PyTorch would only be slower);
- the ResNets (models/resnet8.toml, resnet20.toml: 3x3 stem, stages of basic blocks at
  16/32/64 channels, FRN + TLU, swish, 1x1 projection shortcuts, average pooling, linear
  head) likewise by autograd w.r.t. the flat leaf, FRN written out in eager ops as its
  paper gives it (there is no fused FRN in PyTorch);
- the minibatch is gathered from a uint8 tensor of the whole training set and scaled
  to [0, 1], as `bnn` does.

Data: the 10,000 real MNIST images of bnn's built-in set (data/mnist-mini), the same
images `bnn bench train` uses. Prints one JSON array on stdout with rows shaped like
`bnn bench train`'s.

Install (CPU): python3 -m venv venv && venv/bin/pip install torch numpy
Run:           venv/bin/python bench/pytorch_reference.py --repeats 7
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_common import (  # noqa: E402
    DIFFUSION, FRICTION, FRN_EPSILON, MINI, PRIOR_PRECISION, RESNET_STAGES, STEP_SIZE, read_idx,
    resnet_layout)


class Mlp:
    """Flat parameters with per-layer views, PyTorch's default init."""

    def __init__(self, widths, batch, gen):
        self.widths = widths
        sizes = [(o, i) for i, o in zip(widths[:-1], widths[1:])]
        n = sum(o * i + o for o, i in sizes)
        self.theta = torch.empty(n)
        self.grad = torch.zeros(n)
        self.W, self.b, self.gW, self.gb = [], [], [], []
        at = 0
        for o, i in sizes:
            bound = 1.0 / math.sqrt(i)
            for shape, params, grads in (((o, i), self.W, self.gW), ((o,), self.b, self.gb)):
                size = math.prod(shape)
                view = self.theta[at : at + size].view(shape)
                view.uniform_(-bound, bound, generator=gen)
                params.append(view)
                grads.append(self.grad[at : at + size].view(shape))
                at += size
        self.n = n
        self.params, self.grads = [self.theta], [self.grad]
        # Buffers of the manual backward.
        self.acts = [torch.empty(batch, w) for w in widths[1:]]
        self.deltas = [torch.empty(batch, w) for w in widths[1:]]

    def forward_autograd(self, theta, x):
        at = 0
        h = x
        layers = len(self.widths) - 1
        for k, (i, o) in enumerate(zip(self.widths[:-1], self.widths[1:])):
            W = theta[at : at + o * i].view(o, i)
            at += o * i
            b = theta[at : at + o]
            at += o
            h = torch.addmm(b, h, W.t())
            if k + 1 < layers:
                h = torch.relu(h)
        return h

    def grad_autograd(self, x, y, scale):
        theta = self.theta.detach().requires_grad_(True)
        logits = self.forward_autograd(theta, x)
        loss = torch.nn.functional.cross_entropy(logits, y, reduction="sum") * scale
        (g,) = torch.autograd.grad(loss, theta)
        # Prior: + lambda * theta.
        torch.add(g, self.theta, alpha=PRIOR_PRECISION, out=self.grad)

    def grad_manual(self, x, y, scale):
        layers = len(self.widths) - 1
        h = x
        for k in range(layers):
            out = self.acts[k]
            torch.addmm(self.b[k], h, self.W[k].t(), out=out)
            if k + 1 < layers:
                out.relu_()
            h = out
        d = self.deltas[-1]
        torch.softmax(h, dim=1, out=d)
        d[torch.arange(d.shape[0]), y] -= 1.0
        d.mul_(scale)
        for k in reversed(range(layers)):
            inp = x if k == 0 else self.acts[k - 1]
            # gW = d^T inp + lambda W ; gb = sum d + lambda b
            torch.addmm(self.W[k], d.t(), inp, beta=PRIOR_PRECISION, out=self.gW[k])
            torch.sum(d, dim=0, out=self.gb[k])
            self.gb[k].add_(self.b[k], alpha=PRIOR_PRECISION)
            if k > 0:
                prev = self.deltas[k - 1]
                torch.mm(d, self.W[k], out=prev)
                prev.mul_(self.acts[k - 1] > 0)
                d = prev


LENET_CONV = [6, 16]
LENET_KERNEL = 5
LENET_HIDDEN = [120, 84]


def views_of(shapes, theta):
    """Views of the flat parameter vector `theta`, one per tensor shape, in order."""
    out, at = [], 0
    for s in shapes:
        size = math.prod(s)
        out.append(theta[at : at + size].view(s))
        at += size
    return out


class LeNet:
    """bnn's `models/lenet.toml`: flat parameters, views per tensor, PyTorch's default
    init (U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases)."""

    def __init__(self, gen):
        shapes = []
        c_in, side = 1, 28
        for c in LENET_CONV:
            shapes += [((c, c_in, LENET_KERNEL, LENET_KERNEL), c_in * LENET_KERNEL**2),
                       ((c,), c_in * LENET_KERNEL**2)]
            c_in, side = c, (side - LENET_KERNEL + 1) // 2
        widths = [c_in * side * side] + LENET_HIDDEN + [10]
        for i, o in zip(widths[:-1], widths[1:]):
            shapes += [((o, i), i), ((o,), i)]
        self.shapes = [s for s, _ in shapes]
        self.n = sum(math.prod(s) for s in self.shapes)
        self.theta = torch.empty(self.n)
        self.grad = torch.zeros(self.n)
        at = 0
        for shape, fan_in in shapes:
            size = math.prod(shape)
            bound = 1.0 / math.sqrt(fan_in)
            self.theta[at : at + size].uniform_(-bound, bound, generator=gen)
            at += size
        self.flop_widths = widths
        self.params, self.grads = [self.theta], [self.grad]

    def views(self, theta):
        return views_of(self.shapes, theta)

    def grad_autograd(self, x, y, scale):
        theta = self.theta.detach().requires_grad_(True)
        p = self.views(theta)
        h = x.view(-1, 1, 28, 28)
        convs = len(LENET_CONV)
        for k in range(convs):
            h = F.max_pool2d(F.relu(F.conv2d(h, p[2 * k], p[2 * k + 1])), 2)
        h = h.flatten(1)
        layers = len(p) // 2 - convs
        for k in range(layers):
            h = F.linear(h, p[2 * (convs + k)], p[2 * (convs + k) + 1])
            if k + 1 < layers:
                h = F.relu(h)
        loss = F.cross_entropy(h, y, reduction="sum") * scale
        (g,) = torch.autograd.grad(loss, theta)
        torch.add(g, self.theta, alpha=PRIOR_PRECISION, out=self.grad)

    def step_flop(self, batch):
        """As bnn's `bench::step_flop`: forward, weight gradients, input errors but the first."""
        flop, c_in, side = 0.0, 1, 28
        for l, c in enumerate(LENET_CONV):
            out = side - LENET_KERNEL + 1
            macs = c * c_in * LENET_KERNEL**2 * out * out
            flop += 2.0 * batch * (2.0 if l == 0 else 3.0) * macs
            c_in, side = c, out // 2
        w = self.flop_widths
        return flop + 2.0 * batch * 3.0 * sum(i * o for i, o in zip(w[:-1], w[1:]))



def frn_tlu(z, gamma, beta, tau):
    """Filter response normalisation and its thresholded linear unit, as its paper gives it."""
    nu2 = z.pow(2).mean(dim=(2, 3), keepdim=True)
    y = z * torch.rsqrt(nu2 + FRN_EPSILON) * gamma.view(1, -1, 1, 1) + beta.view(1, -1, 1, 1)
    return torch.max(y, tau.view(1, -1, 1, 1))


def resnet_logits(params, plan, x):
    """bnn's ResNet on images `x` (batch x 784): `params` in bnn's order, `plan` one
    (stride, has a projection, ...) per block. Also bench/gpu_peers.py's, under vmap."""
    p = iter(params)
    h = x.view(-1, 1, 28, 28)
    h = F.silu(frn_tlu(F.conv2d(h, next(p), padding=1), next(p), next(p), next(p)))
    for stride, project, *_ in plan:
        a = F.silu(frn_tlu(F.conv2d(h, next(p), stride=stride, padding=1), next(p), next(p), next(p)))
        a = frn_tlu(F.conv2d(a, next(p), padding=1), next(p), next(p), next(p))
        s = F.conv2d(h, next(p), next(p), stride=stride) if project else h
        h = F.silu(a + s)
    return F.linear(h.mean(dim=(2, 3)), next(p), next(p))


class ResNet:
    """bnn's `models/resnet{8,20}.toml`: parameters in bnn's order (stem conv, FRN
    gamma/beta/tau; per block conv1 + FRN, conv2 + FRN, a 1x1 projection shortcut with a
    bias where the shape changes; fc), PyTorch's default init, gamma = 1, beta = tau = 0."""

    def __init__(self, blocks, gen):
        self.blocks = blocks
        shapes, self.plan = resnet_layout(blocks)
        self.shapes = [s for s, _ in shapes]
        self.n = sum(math.prod(s) for s in self.shapes)
        self.theta = torch.empty(self.n)
        self.grad = torch.zeros(self.n)
        at = 0
        for shape, init in shapes:
            size = math.prod(shape)
            if isinstance(init, float):
                self.theta[at : at + size].fill_(init)
            else:
                bound = 1.0 / math.sqrt(init)
                self.theta[at : at + size].uniform_(-bound, bound, generator=gen)
            at += size
        self.label = "resnet{}-16-32-64-frn-swish".format(6 * blocks + 2)
        # As an nn.Module holds them: each tensor a parameter of its own, its gradient by
        # loss.backward(). As views into one flat vector with torch.autograd.grad the step
        # ran 1.04-1.22x slower (docs/BENCHMARKS.md, "The ResNet peer").
        self.params = [torch.nn.Parameter(t.clone()) for t in self.views(self.theta)]
        self.grads = [torch.zeros_like(t) for t in self.params]
        del self.theta, self.grad

    def views(self, theta):
        return views_of(self.shapes, theta)


    def grad_autograd(self, x, y, scale):
        for t in self.params:
            t.grad = None
        h = resnet_logits(self.params, self.plan, x)
        (F.cross_entropy(h, y, reduction="sum") * scale).backward()
        with torch.no_grad():
            for out, t in zip(self.grads, self.params):
                torch.add(t.grad, t, alpha=PRIOR_PRECISION, out=out)

    def step_flop(self, batch):
        """As bnn's `bench::step_flop`: three products per convolution, two for the stem."""
        flop = 2.0 * batch * 2.0 * RESNET_STAGES[0] * 9 * 28 * 28
        for stride, project, c_in, width, side in self.plan:
            out = (side + 2 - 3) // stride + 1
            flop += 2.0 * batch * 3.0 * (width * c_in * 9 + width * width * 9) * out * out
            if project:
                flop += 2.0 * batch * 3.0 * width * c_in * out * out
        return flop + 2.0 * batch * 3.0 * RESNET_STAGES[-1] * 10


def run(widths, batch, sampler, mode, steps, repeats, images, gen, resnet_blocks=None):
    n_data = images.shape[0]
    cnn = widths is None
    if resnet_blocks:
        model = ResNet(resnet_blocks, gen)
    else:
        model = LeNet(gen) if cnn else Mlp(widths, batch, gen)
    eta = STEP_SIZE
    # One flat tensor (MLP, LeNet) or one per parameter tensor (ResNets): updated with
    # torch._foreach_*, as PyTorch's optimizers do.
    thetas, grads = model.params, model.grads
    v = [torch.randn(t.shape, generator=gen) * math.sqrt(eta) for t in thetas]
    noise = [torch.empty_like(t) for t in thetas]
    alpha = DIFFUSION
    scale = n_data / batch
    order = torch.randperm(n_data, generator=gen)
    labels = torch.from_numpy(LABELS.astype(np.int64))
    grad_fn = model.grad_autograd if mode == "autograd" else model.grad_manual
    cursor = 0

    def one_step():
        nonlocal cursor, alpha
        if cursor + batch > n_data:
            cursor = 0
        idx = order[cursor : cursor + batch]
        cursor += batch
        x = images.index_select(0, idx).float().div_(255.0)
        y = labels.index_select(0, idx)
        grad_fn(x, y, scale)
        for z in noise:
            z.normal_(generator=gen)
        decay, diffusion = (FRICTION, FRICTION) if sampler == "sghmc" else (alpha, DIFFUSION)
        # SGHMC: v <- (1 - alpha) v - eta g + sqrt(2 alpha eta) z ; theta <- theta + v.
        # SGNHT (Ding et al. Alg. 2): the same with the thermostat alpha and
        # sqrt(2 a eta) z; then alpha <- alpha + v.v/n - eta.
        with torch.no_grad():
            torch._foreach_mul_(v, 1.0 - decay)
            torch._foreach_add_(v, grads, alpha=-eta)
            torch._foreach_add_(v, noise, alpha=math.sqrt(2.0 * diffusion * eta))
            torch._foreach_add_(thetas, v)
        if sampler != "sghmc":
            alpha += sum(float(torch.dot(t.flatten(), t.flatten())) for t in v) / model.n - eta

    def timed():
        t = time.perf_counter()
        for _ in range(steps):
            one_step()
        return time.perf_counter() - t

    with torch.no_grad() if mode == "manual" else torch.enable_grad():
        timed()  # warm-up
        secs = statistics.median(timed() for _ in range(repeats))
    if not all(bool(torch.isfinite(t).all()) for t in thetas):
        sys.exit(f"{sampler} diverged at batch {batch}: the timing would not be of a real step")
    sps = steps / secs
    if resnet_blocks:
        flop, name = model.step_flop(batch), model.label
    elif cnn:
        flop = model.step_flop(batch)
        name = "cnn{}-{}-{}-relu".format(
            LENET_KERNEL, "-".join(f"c{c}" for c in LENET_CONV), "-".join(map(str, LENET_HIDDEN)))
    else:
        flop = 2.0 * batch * sum(
            (2.0 if k == 0 else 3.0) * i * o
            for k, (i, o) in enumerate(zip(widths[:-1], widths[1:]))
        )
        name = "mlp-" + "-".join(str(w) for w in widths[1:-1]) + "-relu"
    return {
        "model": name,
        "batch": batch,
        "sampler": sampler,
        "mode": mode,
        "threads": torch.get_num_threads(),
        "steps_per_second": sps,
        "images_per_second": sps * batch,
        "ms_per_step": 1e3 / sps,
        "flop_per_step": flop,
        "gflop_per_second": flop * sps / 1e9,
        "repeats": repeats,
        "steps_per_repeat": steps,
        "torch": torch.__version__,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", default="100;400,400")
    ap.add_argument("--batch", default="100,1000")
    ap.add_argument("--cnn-batch", default="64", help='batches of the LeNet-style CNN ("" for none)')
    ap.add_argument("--resnet", default="", help='ResNet depths, e.g. "8,20" ("" for none)')
    ap.add_argument("--resnet-batch", default="128", help="batches of the ResNets")
    ap.add_argument("--resnet-steps", type=int, default=20,
                    help="ResNet updates per repeat at batch 100 (at least 10)")
    ap.add_argument("--sampler", default="sghmc,sgnht")
    ap.add_argument("--mode", default="both", choices=["both", "autograd", "manual"])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=200, help="updates per repeat at batch 100")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: PyTorch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    global LABELS
    images = torch.from_numpy(
        read_idx(os.path.join(MINI, "train-images-idx3-ubyte.gz")).reshape(-1, 784).copy()
    )
    LABELS = read_idx(os.path.join(MINI, "train-labels-idx1-ubyte.gz"))
    gen = torch.Generator().manual_seed(0)
    modes = ["autograd", "manual"] if args.mode == "both" else [args.mode]
    rows = []
    for hidden in filter(None, args.hidden.split(";")):
        widths = [784] + [int(w) for w in hidden.split(",") if w] + [10]
        for batch in (int(b) for b in args.batch.split(",")):
            steps = max(10, args.steps * 100 // batch)
            for sampler in args.sampler.split(","):
                for mode in modes:
                    rows.append(run(widths, batch, sampler, mode, steps, args.repeats, images, gen))
    for batch in (int(b) for b in args.cnn_batch.split(",") if b.strip()):
        steps = max(10, args.steps * 100 // batch)
        for sampler in args.sampler.split(","):
            # Autograd only: no hand-written convolution backward in eager PyTorch.
            rows.append(run(None, batch, sampler, "autograd", steps, args.repeats, images, gen))
    for depth in (int(d) for d in args.resnet.split(",") if d.strip()):
        if (depth - 2) % 6:
            sys.exit(f"--resnet: depth {depth} is not 6*blocks + 2")
        for batch in (int(b) for b in args.resnet_batch.split(",") if b.strip()):
            steps = max(10, args.resnet_steps * 100 // batch)
            for sampler in args.sampler.split(","):
                rows.append(run(None, batch, sampler, "autograd", steps, args.repeats, images,
                                gen, resnet_blocks=(depth - 2) // 6))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
