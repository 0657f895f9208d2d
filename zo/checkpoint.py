"""checkpoints/last.npz of a training run: written atomically, read and checked in full before a
resumed run takes anything from it.

The file holds the float64 master copy, the deployed integers, the optimizer's state arrays
(opt_*) and a JSON `meta` record: the counters of the loop, the scheduler's state, the run's
fingerprint (model and data hashes, set sizes), the trained tensors' names and the config.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from npusim.app import atomic

from .errors import ZoError
from .optim import make_optimizer

# Settings a resumed run must share with its checkpoint (the budget, eval and checkpoint intervals
# and the set sizes may change).
RESUME_KEYS = (
    "q",
    "optimizer",
    "lr",
    "lr_schedule",
    "momentum",
    "eps",
    "direction",
    "rounding",
    "batch",
    "seed",
    "profile",
    "new_head",
)
# What each part of the fingerprint is, named by the options that decide it.
FINGERPRINT_OPTIONS = {
    "model_sha256": "--model (the model file's sha256)",
    "data_sha256": "--data (the data file's sha256, or the folder)",
    "train_size": "--train-size (training images)",
    "test_size": "--test-size (test images)",
    "input_mapping": "the input mapping of --input-range, --mean, --std",
}
# dead_steps: the run of steps whose probe pairs were all equal, so the dead-run warning resumes too.
COUNTERS = ("step", "forward_passes", "metric_rows", "next_eval", "dead_steps")


# State arrays saved beside the ZO step rule's: the exact-gradient head's Adam and the kept model.
EXTRA_PREFIXES = ("head_", "best_", "activity_")


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fingerprint(model: str, data: str, train_size: int, test_size: int) -> dict:
    """What a checkpoint must have been made with: the model file, the data set (its file's hash, else
    its name) and the sizes of the train and test sets."""
    return {
        "model_sha256": file_sha256(model),
        "data_sha256": file_sha256(data) if Path(data).is_file() else data,
        "train_size": train_size,
        "test_size": test_size,
    }


def checkpoint_path(directory: str | Path) -> Path:
    return Path(directory) / "checkpoints" / "last.npz"


def save(directory: str | Path, meta: dict, master: np.ndarray, ints: np.ndarray, optimizer_state: dict):
    """Write then rename: a crash mid-write (or a full disk) leaves the previous checkpoint intact."""
    path = checkpoint_path(directory)
    arrays = {f"opt_{k}": np.asarray(v) for k, v in optimizer_state.items()}
    try:
        with atomic.replacing(path) as f:  # every write checked, synced, renamed (npusim/app/atomic.py)
            np.savez(
                f,
                master=master,
                ints=ints,
                meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
                **arrays,
            )
    except OSError as e:
        raise ZoError(
            f"cannot write checkpoint {path}: {e.strerror}; the previous checkpoint is kept"
        ) from None


@dataclass
class Checkpoint:
    """A checkpoint file as read, not yet checked against the run that resumes it."""

    directory: Path
    meta: dict
    master: np.ndarray
    ints: np.ndarray
    optimizer: dict  # opt_* arrays without the prefix
    fingerprint: dict
    params: list
    config: dict

    @property
    def damaged(self) -> str:
        return damaged_message(self.directory)


def damaged_message(directory) -> str:
    return f"--resume {directory}: checkpoint {checkpoint_path(directory)} is damaged or not a zo checkpoint"


def load(directory: str | Path) -> Checkpoint:
    """Read a run's checkpoint; a missing, damaged or foreign file is a one-line ZoError."""
    path = checkpoint_path(directory)
    if not path.exists():
        raise ZoError(f"--resume {directory}: no checkpoint at {path}")
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            master, ints = z["master"], z["ints"]
            opt = {k[4:]: z[k] for k in z.files if k.startswith("opt_")}
        fingerprint, params, config = (
            dict(meta["fingerprint"]),
            list(meta["params"]),
            dict(meta["config"]),
        )
    except Exception as e:  # a damaged or foreign file: any decoding failure
        raise ZoError(f"{damaged_message(directory)} ({type(e).__name__})") from None
    return Checkpoint(directory, meta, master, ints, opt, fingerprint, params, config)


@dataclass
class Resumed:
    """A checked checkpoint: everything a run takes over from it."""

    master: np.ndarray  # float64
    ints: np.ndarray
    optimizer: object  # a fresh optimizer of the run's kind holding the saved state
    scheduler_state: dict
    step: int
    forward_passes: int
    metric_rows: int
    dead_steps: int
    next_eval: int
    wall: float
    last_eval_passes: int
    final_accuracy: float
    overhead_seconds: float  # the steps' device time beyond their passes at a whole pass's (0 in older ones)
    extra: dict  # the trainer's other state arrays (the head's Adam, the kept model): EXTRA_PREFIXES


def validate(ck: Checkpoint, config, identity: dict, params: list, size: int) -> Resumed:
    """Check a checkpoint against the run resuming it (config: its TrainConfig; identity: its
    fingerprint; params: the names of its trainable tensors; size: its parameter count). Every
    field is decoded into fresh objects: a mismatch or a damaged field is a one-line ZoError and
    nothing of the run is touched."""
    directory = ck.directory
    for key in identity:
        if ck.fingerprint.get(key) != identity[key]:
            raise ZoError(
                f"--resume {directory}: {FINGERPRINT_OPTIONS.get(key, key)} differs from the run's: "
                f"{ck.fingerprint.get(key)} recorded, {identity[key]} given"
            )
    if ck.params != params:
        raise ZoError(
            f"--resume {directory}: checkpoint trains other layers than --trainable {config.trainable!r}"
        )
    for key in RESUME_KEYS:
        if ck.config.get(key) != getattr(config, key):
            raise ZoError(
                f"--resume {directory}: --{key.replace('_', '-')} differs from the "
                f"checkpoint's ({ck.config.get(key)!r})"
            )
    master, ints, meta = ck.master, ck.ints, ck.meta
    if master.shape != (size,) or ints.shape != (size,):
        raise ZoError(f"--resume {directory}: checkpoint holds {master.size} parameters, expected {size}")
    # Dry run on fresh objects: every field must decode into the state of this run's kinds.
    try:
        if master.dtype.kind != "f" or ints.dtype.kind not in "iu" or not np.all(np.isfinite(master)):
            raise ValueError("master copy or integers")
        optimizer = make_optimizer(config.optimizer, size, config.momentum)
        expected = {k: np.shape(v) for k, v in optimizer.state().items()}
        opt = {k: v for k, v in ck.optimizer.items() if not k.startswith(EXTRA_PREFIXES)}
        extra = {k: v for k, v in ck.optimizer.items() if k.startswith(EXTRA_PREFIXES)}
        if set(opt) != set(expected) or any(np.shape(opt[k]) != shape for k, shape in expected.items()):
            raise ValueError("optimizer state of another shape")
        optimizer.load(opt)
        if not all(np.all(np.isfinite(v)) for v in optimizer.state().values()):
            raise ValueError("optimizer state not finite")
        scheduler = config.make_scheduler()
        scheduler.load(meta["scheduler"])
        if set(meta["scheduler"]) != set(scheduler.state()):
            raise KeyError("scheduler state")
        counters = {k: int(meta[k]) for k in COUNTERS}
        wall = float(meta["wall"])
        overhead = float(meta.get("overhead_seconds", 0.0))
        last_eval, final_accuracy = int(meta["last_eval_passes"]), float(meta["final_accuracy"])
        # overhead may be negative: a hybrid step's suffix passes cost less than whole passes (step_budget)
        if min(counters.values()) < 0 or not np.isfinite(wall) or not np.isfinite(overhead):
            raise ValueError("counters")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ZoError(f"{ck.damaged} ({type(e).__name__}: {e})") from None
    return Resumed(
        master.astype(np.float64),
        ints,
        optimizer,
        meta["scheduler"],
        wall=wall,
        last_eval_passes=last_eval,
        final_accuracy=final_accuracy,
        overhead_seconds=overhead,
        extra=extra,
        **counters,
    )


def truncate_csv(path: Path, rows: int):
    """Keep the header and the first `rows` data rows: rows written after the checkpoint are redone."""
    if not path.exists():
        return
    with open(path, encoding="utf-8", newline=None) as f:
        lines = [line.rstrip("\n") + "\n" for line in f]
    atomic.write_text(path, "".join(lines[: rows + 1]), newline="")
