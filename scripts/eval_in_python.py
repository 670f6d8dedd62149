#!/usr/bin/env python3
"""Reproduces `bnn eval` in Python from a run's files alone: reads run.json, the test set's
IDX files and every sample (safetensors), runs the MLP or CNN forward pass in float32 with
numpy, averages the softmax outputs over the samples in float64 and reports accuracy and
NLL. With --expect EVAL.json (the JSON `bnn eval` printed) it checks that the accuracy is
the same and the NLL within 1e-6, and exits 1 otherwise. See docs/python.md.

Needs numpy and safetensors (pip install numpy safetensors).

    python3 scripts/eval_in_python.py --run checkpoints/RUN [--data-dir DIR] [--expect eval.json]
"""
import argparse
import gzip
import json
import struct
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

REPO = Path(__file__).resolve().parent.parent
MIN_PROB = 1e-12  # as src/metrics.rs clamps before the log


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzip or not) as a uint8 array of its declared shape."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        raise SystemExit(f"{path}: not an unsigned-byte IDX file")
    shape = struct.unpack(">" + "I" * ndim, raw[4 : 4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    return data.reshape(shape)


def find(folder: Path, stem: str) -> Path:
    for name in (stem + ".gz", stem):
        if (folder / name).is_file():
            return folder / name
    raise SystemExit(f"{folder}: no {stem}[.gz]")


def test_set(manifest: dict, data_dir: Path | None):
    if data_dir is None:
        source = manifest["data_source"]
        data_dir = REPO / "data" / "mnist-mini" if source == "built-in" else Path(source)
    images = read_idx(find(data_dir, "t10k-images-idx3-ubyte"))
    labels = read_idx(find(data_dir, "t10k-labels-idx1-ubyte")).astype(np.int64)
    x = images.reshape(len(images), -1).astype(np.float32) / np.float32(255.0)
    std = manifest.get("standardization")
    if std:
        # (p/255 − mean)/std in f32, as Split::gather computes it.
        x = (x - np.asarray(std["mean"], np.float32)) / np.asarray(std["std"], np.float32)
    return x, labels


def activate(h: np.ndarray, kind: str) -> np.ndarray:
    if kind == "relu":
        return np.maximum(h, np.float32(0.0))
    if kind == "sigmoid":
        return (np.float32(1.0) / (np.float32(1.0) + np.exp(-h))).astype(np.float32)
    raise SystemExit(f"activation {kind!r}: this script covers relu and sigmoid")


def conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, pad: int) -> np.ndarray:
    """Cross-correlation, stride 1, `pad` zeros on every side:
    (n, c, h, w) * (o, c, k, k) → (n, o, h+2p−k+1, w+2p−k+1)."""
    k = w.shape[-1]
    if pad:
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    windows = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))
    out = np.tensordot(windows, w, axes=([1, 4, 5], [1, 2, 3]))  # (n, h', w', o)
    return out.transpose(0, 3, 1, 2).astype(np.float32) + b.reshape(1, -1, 1, 1)


def max_pool2(h: np.ndarray) -> np.ndarray:
    n, c, rows, cols = h.shape
    pr, pc = rows // 2, cols // 2
    h = h[:, :, : 2 * pr, : 2 * pc].reshape(n, c, pr, 2, pc, 2)
    return h.max(axis=(3, 5))


def logits(params: dict, model: dict, x: np.ndarray) -> np.ndarray:
    kind = model["kind"]
    if kind not in ("mlp", "cnn"):
        raise SystemExit(f"model kind {kind!r}: this script covers mlp and cnn")
    act = model["activation"]
    h = x
    convs = len(model.get("conv") or []) if kind == "cnn" else 0
    if convs:
        side = int(round(np.sqrt(x.shape[1])))
        h = h.reshape(len(x), 1, side, side)
        for k in range(1, convs + 1):
            z = conv(h, params[f"conv{k}.weight"], params[f"conv{k}.bias"], model.get("padding", 0))
            h = max_pool2(activate(z, act))
        h = h.reshape(len(x), -1)
    layers = sum(1 for name in params if name.startswith("fc") and name.endswith(".weight"))
    for k in range(1, layers + 1):
        h = h @ params[f"fc{k}.weight"].T + params[f"fc{k}.bias"]
        if k < layers:
            h = activate(h, act)
    return h.astype(np.float32)


def softmax32(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True, dtype=np.float32)).astype(np.float32)


def sample_files(run: Path) -> list[Path]:
    """Every sample, chain by chain (chain-0, chain-1, … or the run itself), by step."""
    chains = []
    k = 0
    while (run / f"chain-{k}").is_dir():
        chains.append(run / f"chain-{k}")
        k += 1
    files = []
    for folder in chains or [run]:
        files += sorted((folder / "samples").glob("sample-*.safetensors"))
    return files


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, type=Path)
    ap.add_argument("--data-dir", type=Path)
    ap.add_argument("--expect", type=Path, help="the JSON `bnn eval` printed, to compare with")
    a = ap.parse_args()
    manifest = json.loads((a.run / "run.json").read_text())
    x, y = test_set(manifest, a.data_dir)
    files = sample_files(a.run)
    if not files:
        raise SystemExit(f"{a.run}: no samples")
    total = np.zeros((len(y), 10), dtype=np.float64)
    for f in files:
        p = softmax32(logits(load_file(str(f)), manifest["model"], x))
        total += p.astype(np.float64)
    mean = total / len(files)
    accuracy = float((mean.argmax(axis=1) == y).mean())
    nll = float(-np.log(np.maximum(mean[np.arange(len(y)), y], MIN_PROB)).mean())
    result = {"run": str(a.run), "samples": len(files), "accuracy": accuracy, "nll": nll}
    ok = True
    if a.expect:
        text = a.expect.read_text().strip().splitlines()[-1]
        bnn = json.loads(text)["ensemble"]
        result["bnn_accuracy"], result["bnn_nll"] = bnn["accuracy"], bnn["nll"]
        result["nll_difference"] = abs(nll - bnn["nll"])
        ok = accuracy == bnn["accuracy"] and result["nll_difference"] <= 1e-6
        result["matches"] = ok
    print(json.dumps(result))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
