"""`zo train --resume DIR`: the options of the run, from DIR/config.json, and the ones given beside.

Alone, --resume continues the run exactly as recorded. An option given beside it must agree with the
record, except:
- --budget (or --budget-ms), --eval-every and --checkpoint-every: how long the run goes and how
  often it reports (a finished run given a larger budget trains on);
- --model and --data: compared by content (the checkpoint's fingerprint: a model file moved or
  copied is the same model);
- --input-range, --mean, --std: compared as the input mapping they resolve to (`auto` and the range
  it found are the same run).
These three kinds are checked by checkpoint.validate against the checkpoint itself.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import fields
from pathlib import Path

from .errors import ZoError
from .trainer import TrainConfig, default_lr

MAY_CHANGE = ("budget", "budget_ms", "eval_every", "checkpoint_every")
BY_CONTENT = ("model", "data")
BY_MAPPING = ("input_range", "mean", "std")


def option(name: str) -> str:
    return "--" + name.replace("_", "-")


def recorded_options(directory: str | Path) -> dict:
    """The TrainConfig fields DIR/config.json recorded; a missing or damaged file is a ZoError."""
    path = Path(directory) / "config.json"
    try:
        recorded = json.loads(path.read_text())
        missing = [f.name for f in fields(TrainConfig) if f.name not in recorded]
        if missing:
            raise KeyError(", ".join(missing))
    except FileNotFoundError:
        raise ZoError(f"--resume {directory}: no {path}: not the directory of a zo train run") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ZoError(
            f"--resume {directory}: {path} is damaged or not a zo config ({type(e).__name__})"
        ) from None
    return {f.name: recorded[f.name] for f in fields(TrainConfig)}


def _same(name: str, recorded, given, options: dict) -> bool:
    if name == "lr":  # unset means the default: --lr 0.01 under nsgd from a ridge head is the same run
        default = default_lr(options["optimizer"], options["head_init"])
        return (recorded if recorded is not None else default) == (given if given is not None else default)
    return recorded == given


def _shown(value) -> str:
    return "unset" if value is None else str(value)


def resumed_options(directory: str | Path, options: dict, given: set) -> dict:
    """TrainConfig fields of a resumed run: recorded ones, with the options given on the command line
    (the names in `given`, their values in `options`) where they may differ or are equal."""
    recorded = recorded_options(directory)
    merged = dict(recorded)
    config = Path(directory) / "config.json"
    if given & set(BY_MAPPING):  # one mapping, spelled by the three together: all from the command line
        merged.update({name: options[name] for name in BY_MAPPING})
    for name in (n for n in recorded if n in given):
        value = options[name]
        if name in MAY_CHANGE + BY_CONTENT + BY_MAPPING:
            merged[name] = value
        elif not _same(name, recorded[name], value, recorded):
            if isinstance(value, bool):
                what = f"{option(name)}: the run was started {'with' if recorded[name] else 'without'} it"
            else:
                what = (
                    f"{option(name)} {_shown(value)} differs from the run's {option(name)} "
                    f"{_shown(recorded[name])}"
                )
            raise ZoError(
                f"--resume {directory}: {what} ({config}); leave it out to continue the run as recorded"
            )
    return merged


def resume_command(directory: str | Path, given: dict | None = None) -> str:
    """The command that continues the run in DIR, as it can be pasted: --resume DIR, and those of the
    options given (MAY_CHANGE ones: the rest equal the record) that DIR/config.json does not hold yet
    (a run interrupted before it wrote its config)."""
    try:
        recorded = recorded_options(directory)
    except ZoError:
        recorded = {}
    words = ["zo", "train", "--resume", str(directory)]
    for name, value in (given or {}).items():
        if name in MAY_CHANGE and name in recorded and recorded[name] != value:
            words += [option(name), str(value)]
    return shlex.join(words)
