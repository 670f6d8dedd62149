"""What the Python peers of `bnn` share, without importing a framework: the built-in
MNIST subset, bnn's default SGHMC / SGNHT constants and its ResNet presets' shape."""

import gzip
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MINI = os.path.join(HERE, "..", "data", "mnist-mini")

# bnn's defaults (src/sampler/mod.rs): eta = 2e-6; SGHMC alpha = 0.1; SGNHT a = 0.1.
STEP_SIZE = 2e-6
FRICTION = 0.1
DIFFUSION = 0.1
PRIOR_PRECISION = 1.0  # Gamma(1, 1) prior's initial precision, as in bnn

# models/resnet{8,20}.toml: the stages' widths; FRN's epsilon.
RESNET_STAGES = [16, 32, 64]
FRN_EPSILON = 1e-6


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def resnet_layout(blocks):
    """bnn's `models/resnet{8,20}.toml` on 28 x 28 images with `blocks` blocks a stage:
    each parameter tensor's (shape, init) in bnn's order (stem conv, FRN gamma/beta/tau;
    per block conv1 + FRN, conv2 + FRN, a 1x1 projection shortcut with a bias where the
    shape changes; fc), init a fan-in (PyTorch's default uniform) or a constant; and per
    block (stride, has a projection, c_in, width, input side)."""
    shapes, plan = [], []

    def conv(c_out, c_in, k, bias):
        shapes.append(((c_out, c_in, k, k), c_in * k * k))
        if bias:
            shapes.append(((c_out,), c_in * k * k))
        else:
            shapes.extend([((c_out,), 1.0), ((c_out,), 0.0), ((c_out,), 0.0)])

    conv(RESNET_STAGES[0], 1, 3, False)
    c_in, side = RESNET_STAGES[0], 28
    for s, width in enumerate(RESNET_STAGES):
        for b in range(blocks):
            stride = 2 if s > 0 and b == 0 else 1
            conv(width, c_in, 3, False)
            conv(width, width, 3, False)
            project = stride != 1 or c_in != width
            if project:
                conv(width, c_in, 1, True)
            plan.append((stride, project, c_in, width, side))
            side = (side + 2 - 3) // stride + 1
            c_in = width
    shapes += [((10, c_in), c_in), ((10,), c_in)]
    return shapes, plan
