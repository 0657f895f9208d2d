"""Diagnostic bound for `--estimator local`: the trainer with its step and its price (`--local-examples
K` too), but the layers below the exact tail moved along float back-propagation's exact gradient of
the global loss (from the same K examples), not the local loss's. Not device-plausible (and priced
without back-propagation's input-gradient work): an upper bound for any estimator priced so.

    python -m experiments.tables.local_oracle --shared ../shared --out DIR [--local-examples 8]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from zo.float_suffix import FloatSuffix
from zo.trainer import TrainConfig, Trainer


def exact_below_tail(t: Trainer):
    """A LocalEstimator.gradient replacement: back-propagation's gradient over t.local.coords."""
    units = {p.tensor: p.unit for p in t.model.params}
    batches = {}
    batch_indices = t.batch_indices

    def remembered(step):
        batches[step] = batch_indices(step)
        return batches[step]

    def gradient(values, labels, step):
        idx, local = batches.pop(step), t.local
        rows = np.arange(len(labels))
        if local.examples is not None and local.examples < len(labels):  # zo/local.py's draw
            rng = np.random.Generator(np.random.PCG64([local.seed, step, 0x10CA1]))
            rows = np.sort(rng.choice(len(labels), local.examples, replace=False))
        net = FloatSuffix(t.model, np.float64)
        _, grads = net.loss_and_gradient(net.dequantize(t.train_cache, idx[rows]), labels[rows])
        parts = [
            (grads[w] * net.steps[w] * units[w]).ravel()
            for layer in local.layers
            for w in layer.op.inputs[1:3]
            if w in units
        ]
        return np.concatenate(parts), 0

    t.batch_indices = remembered
    return gradient


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", type=Path, default=Path("../shared"))
    p.add_argument("--model", default="resnet8_cifar10_int8.tflite")
    p.add_argument("--data", default="eurosat32_subset.npz")
    p.add_argument("--trainable", default="last:6")
    p.add_argument("--budget-ms", type=float, default=399100)
    p.add_argument("--local-examples", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    config = TrainConfig(
        model=str(a.shared / "models" / a.model), data=str(a.shared / "data" / a.data),
        trainable=a.trainable, new_head=True, budget_ms=a.budget_ms, estimator="local",
        local_examples=a.local_examples, seed=a.seed,
    )  # fmt: skip
    t = Trainer(config, a.out)
    t.local.gradient = exact_below_tail(t)
    start = time.time()
    print(t.run(), f"wall {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
