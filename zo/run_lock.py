"""One writer per run folder: `zo train` holds an exclusive lock on DIR/.zo.lock (flock) for as long as
it runs. Two writers on one folder (a run, and a `--resume` of it started while it ran) interleaved
metrics.csv and lost a checkpoint; the second one now exits 2 naming the first's pid. The lock goes
with the process (a killed run leaves no stale lock: the kernel drops it), and the file, which only
names the holder, may stay.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ZoError

LOCK_NAME = ".zo.lock"
_held: dict = {}  # folder -> the open lock file, kept open (and locked) until the process ends


def lock_run(folder, option: str = "--out") -> None:
    """Take the folder's lock (creating the folder), or raise ZoError naming the process that has it."""
    import fcntl

    folder = Path(folder)
    key = str(folder.resolve())
    if key in _held:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        f = open(folder / LOCK_NAME, "a+")
    except OSError as e:
        raise ZoError(f"{option} {folder}: cannot create the run's lock file ({e.strerror})") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise ZoError(
            f"{option} {folder}: another zo train (pid {holder}) is writing this run; wait for it to "
            "end (or stop it), or choose another directory"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    _held[key] = f


def release_run(folder) -> None:
    """Let go of the folder's lock (the process's end does it too)."""
    f = _held.pop(str(Path(folder).resolve()), None)
    if f is not None:
        f.close()


def refuse_own_model(model, folder, option: str = "--out") -> None:
    """The run writes its model, checkpoints and logs into the folder: a model file inside it would
    be overwritten by the run's own export (zo train --model D/model.tflite --out D)."""
    if model is None:
        return
    model, folder = Path(model).resolve(), Path(folder).resolve()
    if folder == model or folder in model.parents:
        raise ZoError(
            f"{option} {folder}: holds the input model {model}, which the run would overwrite with its "
            "own; choose another directory (or move the model out of it)"
        )
