"""How well the local losses (zo/local.py) resolve each layer below the exact tail, measured: per
layer, the cosine with float back-propagation's gradient of the global loss (zo/float_suffix.py) of
activity perturbation (q = 1, 4), the local-loss gradient and the guided estimate, on the same
mini-batches, at the fresh-head start or at a run's checkpoint.

    python -m experiments.tables.local_cosine --shared ../shared [--run DIR] [--batches 6]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from dataclasses import fields
from pathlib import Path

import numpy as np

from zo.float_suffix import FloatSuffix
from zo.local import LocalEstimator
from zo.trainer import TrainConfig, Trainer

from .activity_cosine import cosine


def trainer_at(a, folder: Path) -> Trainer:
    """A last:K trainer at the fresh-head start, or at the checkpoint of the run in a.run."""
    if a.run is None:
        config = TrainConfig(
            model=str(a.shared / "models" / a.model), data=str(a.shared / "data" / a.data),
            trainable=a.trainable, new_head=True, train_size=a.train_size, test_size=50,
            checkpoint_every=10**9,
        )  # fmt: skip
        return Trainer(config, folder / "run")
    shutil.copytree(a.run, folder / "run")
    record = json.loads((folder / "run" / "config.json").read_text())
    names = {f.name for f in fields(TrainConfig)} - {"input_mapping"}
    t = Trainer(TrainConfig(**{k: v for k, v in record.items() if k in names}), folder / "run")
    t.load_checkpoint(folder / "run")
    return t


def measure(t: Trainer, batches: int) -> dict:
    """{layer: {estimator: mean cosine}}; the auxiliary heads ridge-fitted on every training row."""
    t.calibrate_activity_eps()
    act = t.activity
    local = LocalEstimator(t.model, [layer.f for layer in act.layers], t.flat_offsets(), t.model.num_classes)
    rows = t.train_rows
    local.fit({k: v[rows] for k, v in t.train_cache.items()}, t.data.y_train[rows])
    for mine, theirs in zip(local.layers, act.layers):
        mine.eps = theirs.eps
    net = FloatSuffix(t.model, np.float64)
    out = {layer.name: {} for layer in act.layers}
    for step in range(10**6, 10**6 + batches):
        idx = t.batch_indices(step)
        labels = t.data.y_train[idx]
        values = {k: v[idx] for k, v in t.train_cache.items()}
        t.model.interp.evaluate(values, t.model.suffix)
        _, grads = net.loss_and_gradient(net.dequantize(t.train_cache, idx), labels)
        errors = {k: a.error(a.features(values), labels) for k, a in local.aux.items()}
        for theirs, mine in zip(act.layers, local.layers):
            w = theirs.op.inputs[1]
            ref = (grads[w] * np.broadcast_to(net.steps[w], grads[w].shape)).ravel()
            r = out[theirs.name]
            for q in (1, 4):
                g, _ = act.gradient(values, theirs, q, step, labels)
                r.setdefault(f"activity q={q}", []).append(cosine(g[: ref.size], ref))
            dy = local.output_gradient(values, mine, errors[mine.aux.tensor])
            r.setdefault("local", []).append(cosine(local.weight_gradient(values, mine, dy)[: ref.size], ref))
            guided = local.guided_output_gradient(values, mine, dy, labels)
            r.setdefault("guided", []).append(
                cosine(local.weight_gradient(values, mine, guided)[: ref.size], ref)
            )
    return {name: {k: float(np.mean(v)) for k, v in r.items()} for name, r in out.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", type=Path, default=Path("../shared"))
    p.add_argument("--model", default="resnet8_cifar10_int8.tflite")
    p.add_argument("--data", default="eurosat32_subset.npz")
    p.add_argument("--trainable", default="last:6")
    p.add_argument("--run", type=Path, default=None, help="a last:K activity run's folder (its checkpoint)")
    p.add_argument("--batches", type=int, default=6)
    p.add_argument("--train-size", type=int, default=2000)
    a = p.parse_args(argv)
    start = time.process_time()
    with tempfile.TemporaryDirectory(prefix="local-cosine-") as folder:
        result = measure(trainer_at(a, Path(folder)), a.batches)
    result["cpu_seconds"] = time.process_time() - start
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
