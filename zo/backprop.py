"""The back-propagation upper bound that ZO results are reported beside: the same trainable layers,
trained in float with exact gradients.

The trainable suffix runs in float (FloatSuffix, zo/float_suffix.py, on the ops of zo/float_ops.py):
dequantized weights, biases and activations, the int8 graph's clamps, no rounding, so its logits
match npusim's up to quantization error.

backprop_baseline trains the float copies of the trainable tensors with mini-batch Adam on the
cross-entropy of the logits (zo/loss.py, the ZO trainer's loss), then writes them back into the int8
model with the deployed scales fixed, as the ZO trainer does, and measures both.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import numpy as np

from .errors import ZoError
from .float_suffix import FloatSuffix
from .model import TrainableModel
from .optim import OPTIMIZERS, SCHEDULES, learning_rate

try:  # optional: caps the BLAS threads of the training loop
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover - then the BLAS keeps its own thread count
    threadpool_limits = None

__all__ = ["DEFAULT_LR", "FloatSuffix", "backprop_baseline", "int8_accuracy"]

BELOW = ("full", "subspace", "frozen")  # what the bound trains below the head (backprop_baseline)
# lr by coordinate units (see backprop_baseline) and optimizer.
DEFAULT_LR = {"steps": {"adam": 1.0, "sgd": 10.0}, "real": {"adam": 1e-3, "sgd": 1e-2}}


# ----------------------------------------------------------------------------------------------
# The baseline


def int8_accuracy(
    model: TrainableModel, values: list[np.ndarray], test_cache: dict, y_test: np.ndarray
) -> float:
    """Test accuracy of the int8 model (npusim) with the trainable tensors set to values; the
    model's own values are restored afterwards."""
    original = [v.copy() for v in model.values()]
    try:
        model.set_values(values)
        return float(np.mean(model.predict(test_cache) == y_test))
    finally:
        model.set_values(original)


def backprop_baseline(
    trainer_or_model,
    train_cache: dict | None = None,
    y_train: np.ndarray | None = None,
    test_cache: dict | None = None,
    y_test: np.ndarray | None = None,
    *,
    epochs: int = 10,
    lr: float | None = None,
    batch: int = 32,
    seed: int = 0,
    optimizer: str = "adam",
    units: str = "steps",
    lr_schedule: str = "cosine",
    project: bool = True,
    eval_every_epoch: bool = True,
    blas_threads: int | None = 1,
    blocks: list | None = None,
    below: str = "full",
) -> dict:
    """Train the trainable layers in float by back-propagation; report float and int8 accuracy.

    trainer_or_model: a zo Trainer (its model, caches and labels are the defaults) or a
    TrainableModel with the caches and labels given. Training starts from the values currently in
    the model (the deployed weights, or a fresh head's zero weights), so call it before ZO training
    changes them; the model itself is left unchanged.

    units: what the optimizer's coordinates are. "steps" (default): each tensor in the ZO trainer's
    integer units (one weight LSB, BIAS_UNIT bias LSB, scales as deployed), so lr means the same as
    the ZO trainer's (Adam: about the largest change per update, in steps) and one lr fits layers
    whose weight scales differ by 50x (ResNet-8's last block and head); default lr 1.0 (adam, best
    of 0.1, 0.3, 1.0 on each of the three runs in the report) or 10 (sgd with momentum, whose step
    is lr times a gradient per step: 30 was best and 100 diverged on ResNet-8's head). "real": real
    units, the textbook float setting; default lr 1e-3. lr_schedule ("constant", "cosine", "linear")
    runs over all steps. project keeps each tensor inside its int8 / int32 range after every step,
    so the float model stays deployable with the fixed scales. blas_threads caps the BLAS threads
    while training (needs threadpoolctl; None leaves them): the GEMMs of a batch of 32 are small,
    and on 2 shared cores a second OpenBLAS thread made a ResNet-8 last:4 step 1.2x slower (load
    ~3), and float64 checks on a loaded machine (load ~7) 5x slower.

    blocks: the ZO trainer's blocks (zo/blocks.py), the tensors below the head. below="full" trains
    them in full; "subspace" projects each block's gradient onto the subspace its perturbations
    span (a weight tensor's per-channel scalings by default) and lifts it back, so the bound is what
    exact gradients reach where ZO can move (ZO's own ceiling); "frozen" leaves them (what the head
    alone reaches). The head trains in full in every case.

    Returns float_test_accuracy; values and int8_test_accuracy (the trained float values written back
    with the deployed scales fixed, in model.params order: round to nearest, weights clamped to
    [-127, 127], biases to int32; run on npusim); both before training (*_initial); train_loss
    (mean over the last epoch); history (per epoch: train_loss and, with eval_every_epoch,
    float_test_accuracy); the settings; seconds.
    """
    if isinstance(trainer_or_model, TrainableModel):
        model = trainer_or_model
    elif hasattr(trainer_or_model, "model") and hasattr(trainer_or_model, "train_cache"):
        tr = trainer_or_model
        model = tr.model
        train_cache = tr.train_cache if train_cache is None else train_cache
        test_cache = tr.test_cache if test_cache is None else test_cache
        y_train = tr.data.y_train if y_train is None else y_train
        y_test = tr.data.y_test if y_test is None else y_test
    else:
        raise ZoError(
            "backprop_baseline: expected a Trainer or a TrainableModel, got "
            f"{type(trainer_or_model).__name__}"
        )
    if train_cache is None or y_train is None or test_cache is None or y_test is None:
        raise ZoError(
            "backprop_baseline: train_cache, y_train, test_cache and y_test are required with a "
            "TrainableModel"
        )
    if optimizer not in DEFAULT_LR["steps"]:
        expected = ", ".join(DEFAULT_LR["steps"])
        raise ZoError(f"backprop_baseline: optimizer {optimizer!r}, expected one of {expected}")
    if units not in DEFAULT_LR:
        raise ZoError(f"backprop_baseline: units {units!r}, expected one of {', '.join(DEFAULT_LR)}")
    if below not in BELOW:
        raise ZoError(f"backprop_baseline: below {below!r}, expected one of {', '.join(BELOW)}")
    if lr_schedule not in SCHEDULES:
        raise ZoError(
            f"backprop_baseline: lr_schedule {lr_schedule!r}, expected one of {', '.join(SCHEDULES)}"
        )
    lr = DEFAULT_LR[units][optimizer] if lr is None else lr
    if epochs < 0 or batch < 1 or not (lr > 0 and np.isfinite(lr)):
        raise ZoError(
            f"backprop_baseline: epochs {epochs}, batch {batch}, lr {lr}: expected epochs >= 0, "
            "batch >= 1, lr > 0"
        )
    limit = (
        threadpool_limits(blas_threads, user_api="blas")
        if blas_threads and threadpool_limits
        else nullcontext()
    )
    with limit:
        return _train(
            model,
            train_cache,
            np.asarray(y_train, dtype=np.int64),
            test_cache,
            np.asarray(y_test, dtype=np.int64),
            epochs,
            lr,
            batch,
            seed,
            optimizer,
            units,
            lr_schedule,
            project,
            eval_every_epoch,
            blocks or [],
            below,
        )


class Restriction:
    """The coordinates the bound's optimizer moves: every trainable value, except that each ZO block
    (zo/blocks.py) is moved along its own dims ("subspace": the optimizer's state and step live in
    the block's coordinates, as ZO's do, and are lifted to its values) or not at all ("frozen");
    "full" moves every value. Flat vectors are in the trainer's order (model.params), as the
    blocks' offsets are."""

    def __init__(self, blocks: list, below: str, size: int):
        self.blocks = [] if below == "full" else sorted(blocks, key=lambda b: b.start)
        self.below = below
        self.free = np.ones(size, dtype=bool)
        for b in self.blocks:
            self.free[b.start : b.end] = False
        kept = sum(b.dims for b in self.blocks) if below == "subspace" else 0
        self.size = int(self.free.sum()) + kept

    def reduce(self, g: np.ndarray, master: np.ndarray) -> np.ndarray:
        """A gradient over every value -> one over the optimizer's coordinates."""
        parts = [g[self.free]]
        if self.below == "subspace":
            parts += [b.project(g[b.start : b.end], master[b.start : b.end]) for b in self.blocks]
        return np.concatenate(parts)

    def expand(self, u: np.ndarray, master: np.ndarray) -> np.ndarray:
        """A step over the optimizer's coordinates -> a move of every value."""
        out = np.zeros(self.free.size)
        n = int(self.free.sum())
        out[self.free] = u[:n]
        if self.below == "subspace":
            for b in self.blocks:
                out[b.start : b.end] = b.lift(u[n : n + b.dims], master[b.start : b.end])
                n += b.dims
        return out


def _train(
    model,
    train_cache,
    y_train,
    test_cache,
    y_test,
    epochs,
    lr,
    batch,
    seed,
    optimizer,
    units,
    lr_schedule,
    project,
    eval_every_epoch,
    blocks,
    below,
) -> dict:
    start, cpu_start = time.perf_counter(), time.process_time()

    net = FloatSuffix(model, np.float32)
    # The optimizer moves x = w / unit (unit: real value of one coordinate step); dL/dx = unit * dL/dw.
    if units == "steps":
        unit = {
            p.tensor: np.broadcast_to(net.steps[p.tensor] * p.unit, net.params[p.tensor].shape)
            for p in model.params
        }
    else:
        unit = {t: np.ones(v.shape) for t, v in net.params.items()}
    unit_flat = np.concatenate([unit[t].ravel() for t in net.trainable])
    bound_flat = (
        np.concatenate([np.broadcast_to(net.bounds[t], unit[t].shape).ravel() for t in net.trainable])
        / unit_flat
    )
    offsets = np.cumsum([0] + [net.params[t].size for t in net.trainable])
    master = np.concatenate([net.params[t].astype(np.float64).ravel() for t in net.trainable]) / unit_flat
    restricted = Restriction(blocks, below, master.size)
    opt = OPTIMIZERS[optimizer](restricted.size)

    def write_params():
        real = master * unit_flat
        net.params = {
            t: real[offsets[i] : offsets[i + 1]].reshape(net.params[t].shape).astype(net.dtype)
            for i, t in enumerate(net.trainable)
        }

    def test_accuracy_float():
        return float(np.mean(net.predict(test_cache) == y_test))

    result = {
        "trainable": [p.name for p in model.params],
        "parameters": int(master.size),
        "epochs": epochs,
        "lr": lr,
        "units": units,
        "batch": batch,
        "seed": seed,
        "optimizer": optimizer,
        "lr_schedule": lr_schedule,
        "float_test_accuracy_initial": test_accuracy_float(),
        "int8_test_accuracy_initial": float(np.mean(model.predict(test_cache) == y_test)),
    }
    n = len(y_train)
    b = min(batch, n)
    per_epoch = n // b
    total = max(epochs * per_epoch, 1)
    rng = np.random.default_rng(seed)
    history, step = [], 0
    for epoch in range(epochs):
        order = rng.permutation(n)
        losses = np.empty(per_epoch)
        for j in range(per_epoch):
            index = np.sort(order[j * b : (j + 1) * b])
            losses[j], grads = net.loss_and_gradient(net.dequantize(train_cache, index), y_train[index])
            g = np.concatenate([grads[t].astype(np.float64).ravel() for t in net.trainable]) * unit_flat
            update = opt.step(restricted.reduce(g, master), learning_rate(lr, lr_schedule, step / total))
            master += restricted.expand(update, master)
            if project:
                np.clip(master, -bound_flat, bound_flat, out=master)
            write_params()
            step += 1
        row = {"epoch": epoch + 1, "train_loss": float(losses.mean())}
        if eval_every_epoch:
            row["float_test_accuracy"] = test_accuracy_float()
        history.append(row)
    result["float_test_accuracy"] = (
        history[-1]["float_test_accuracy"] if history and eval_every_epoch else test_accuracy_float()
    )
    result["values"] = net.int_values()
    result["int8_test_accuracy"] = int8_accuracy(model, result["values"], test_cache, y_test)
    result["train_loss"] = history[-1]["train_loss"] if history else float("nan")
    result["history"] = history
    result["seconds"] = time.perf_counter() - start
    result["cpu_seconds"] = (
        time.process_time() - cpu_start
    )  # all threads; wall time varies on a shared machine
    return result


# The bound's own learning rates (Adam, in integer steps): the one of best held-out accuracy is used.
BOUND_LRS = (0.03, 0.1, 0.3, 1.0)


def bound_with_own_lr(
    trainer, seed: int, below: str = "full", blocks: list | None = None
) -> tuple[float, dict]:
    """Back-propagation from the trainer's start on its training images, the lr of BOUND_LRS chosen
    on its held-out split (zo/keep.py; never the test set); returns (lr, the chosen run measured on
    the test set). below: the tensors of `blocks` (default: the trainer's ZO blocks) trained in full,
    only along what those blocks perturb ("subspace": weight ZO's own ceiling), or not at all
    ("frozen")."""
    data, rows, val = trainer.data, trainer.train_rows, trainer.val_rows
    train = {t: v[rows] for t, v in trainer.train_cache.items()}

    def run(lr, cache, labels):
        return backprop_baseline(
            trainer.model, train, data.y_train[rows], cache, labels, seed=seed, lr=lr,
            blocks=trainer.blocks if blocks is None else blocks, below=below,
        )  # fmt: skip

    held = {t: v[val] for t, v in trainer.train_cache.items()}
    scores = {lr: run(lr, held, data.y_train[val])["int8_test_accuracy"] for lr in BOUND_LRS}
    lr = max(BOUND_LRS, key=lambda k: scores[k])
    return lr, run(lr, trainer.test_cache, data.y_test)
