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
