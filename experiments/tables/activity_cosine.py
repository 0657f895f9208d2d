"""How well `--estimator activity` resolves each layer below the exact tail, measured: per layer, the
cosine of its one-step estimate (zo/activity.py, q directions per example, int8 suffix passes on
npusim) with float back-propagation's gradient on the same mini-batch (zo/float_suffix.py), beside
the textbook weight-space SPSA estimate at the same 2q passes (float, one Gaussian direction over the
layer's whole weight tensor), and the estimate's norm over the true gradient's (what a step rule
that normalises by the estimate's size sees).

    python -m experiments.tables.activity_cosine --shared ../shared [--trainable last:6] [--batches 10]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from zo.float_suffix import FloatSuffix
from zo.loss import cross_entropy
from zo.trainer import TrainConfig, Trainer


def cosine(a, b) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-300))


def spsa_weights(net, inputs, labels, tensor, q: int, rng) -> np.ndarray:
    """Weight-space SPSA over one tensor, in the trainer's units (float passes, eps 1 unit)."""
    step = np.broadcast_to(net.steps[tensor], net.params[tensor].shape)
    g = np.zeros(net.params[tensor].size)
    for _ in range(q):
        u = rng.standard_normal(net.params[tensor].shape)
        losses = []
        for sign in (1.0, -1.0):
            params = dict(net.params)
            params[tensor] = (net.params[tensor] + sign * u * step).astype(net.dtype)
            logits = net.forward(inputs, params)
            logits = logits[0] if isinstance(logits, tuple) else logits
            losses.append(cross_entropy(np.asarray(logits, np.float64), labels).mean())
        g += (losses[0] - losses[1]) / 2.0 * u.ravel()
    return g / q


def cosine_rows(t: Trainer, steps, qs=(1, 4), spsa_q: int = 1) -> dict:
    """{layer: {"activity q=Q": [cosine per mini-batch], "norm ratio q=Q": [...], "spsa q=S": [...]}}
    at t's state: each activity layer's estimate and weight SPSA's against float back-propagation."""
    net = FloatSuffix(t.model, np.float64)
    rng = np.random.default_rng(0)
    rows = {layer.name: {} for layer in t.activity.layers}
    for step in steps:
        idx = t.batch_indices(step)
        labels = t.data.y_train[idx]
        values = {k: v[idx] for k, v in t.train_cache.items()}
        t.model.interp.evaluate(values, t.model.suffix)
        inputs = net.dequantize(t.train_cache, idx)
        _, grads = net.loss_and_gradient(inputs, labels)
        for layer in t.activity.layers:
            w = layer.op.inputs[1]
            ref = (grads[w] * np.broadcast_to(net.steps[w], grads[w].shape)).ravel()
            r = rows[layer.name]
            for q in qs:
                g, _ = t.activity.gradient(values, layer, q, step, labels)
                g = g[: ref.size]
                r.setdefault(f"activity q={q}", []).append(cosine(g, ref))
                r.setdefault(f"norm ratio q={q}", []).append(float(np.linalg.norm(g) / np.linalg.norm(ref)))
            spsa = spsa_weights(net, inputs, labels, w, spsa_q, rng)
            r.setdefault(f"spsa q={spsa_q}", []).append(cosine(spsa, ref))
    return rows


def measure(t: Trainer, batches: int, qs=(1, 4)) -> dict:
    """{layer: {"eps": LSB, "activity q=Q": mean cosine, "spsa q=1": ..., "norm ratio q=Q": ...}}."""
    t.calibrate_activity_eps()
    out = {layer.name: {"eps": layer.eps} for layer in t.activity.layers}
    for name, r in cosine_rows(t, range(batches), qs).items():
        out[name].update({k: float(np.mean(v)) for k, v in r.items()})
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", type=Path, default=Path("../shared"))
    p.add_argument("--model", default="resnet8_cifar10_int8.tflite")
    p.add_argument("--data", default="eurosat32_subset.npz")
    p.add_argument("--trainable", default="last:6")
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--train-size", type=int, default=2000)
    p.add_argument("--eps", type=int, default=None, help="every layer's eps in LSB (default: measured)")
    a = p.parse_args(argv)
    start = time.process_time()
    config = TrainConfig(
        model=str(a.shared / "models" / a.model), data=str(a.shared / "data" / a.data),
        trainable=a.trainable, new_head=True, train_size=a.train_size, test_size=50,
        checkpoint_every=10**9, eps=a.eps,
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="activity-cosine-") as run:
        result = measure(Trainer(config, Path(run) / "run"), a.batches)
    result["cpu_seconds"] = time.process_time() - start
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
