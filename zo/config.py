"""zo train's options as a run records them (config.json) and checks them, with the defaults that
depend on each other (the step rules' rates)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import blocks as zo_blocks
from .errors import ZoError
from .head_init import DEFAULT_HEAD_INIT, check_head_init
from .optim import OPTIMIZERS, SCHEDULES
from .perturbation import KINDS
from .schedulers import Scheduler, parse_scheduler

# The step rules' default rates from a zero fresh head (`--head-init zero`), chosen on the study's
# design cells (docs/zo.md).
DEFAULT_LR = {"nsgd": 0.03, "sgd": 0.5, "adam": 0.1}
# From a start that already classifies (an initialized fresh head, or the deployed head) nsgd's
# scale-free step walks away from it at 0.03: 0.01 was better on each of five design cells (docs/zo.md,
# "ZO at the default step"). sgd and adam were not measured from such a start and keep their rates.
INITIALIZED_LR = {"nsgd": 0.01}


def default_lr(optimizer: str, head_init: str) -> float:
    """The learning rate an unset --lr means: it depends on whether training starts from a zero head."""
    if head_init == "zero":
        return DEFAULT_LR[optimizer]
    return INITIALIZED_LR.get(optimizer, DEFAULT_LR[optimizer])


# Probe pairs with L+ == L- in every one of this many consecutive steps: the run is dead, say so once.
DEAD_STEPS = 50
# Training images whose frozen features fix a fresh head's quantization (evenly spaced, seed-free:
# every run on a model and data set gets the same head).
CALIBRATION_IMAGES = 256
# Probe images per suffix call: bounds the simulator's memory when 2q * batch is large.
MAX_IMAGES_PER_CALL = 2048
# The exact-gradient head's step rule: Adam, lr in integer steps (about the largest move per step).
HEAD_LR = 0.1
HEAD_SCHEDULE = "cosine"
# --keep best: every VALIDATION_EVERY-th training image is held out (never trained on) to pick the
# model to keep; the test split is never used for it.
VALIDATION_EVERY = 10
# A first step's training loss below this (nats) gets a note: the model already fits the training set.
FITTED_LOSS = 1e-3


@dataclass
class TrainConfig:
    model: str
    data: str
    trainable: str = "last:1"
    q: str = "qscheduler"
    optimizer: str = "nsgd"
    lr: float | None = None
    lr_schedule: str = "constant"
    momentum: float = 0.9
    eps: int | None = None  # int8 steps of a perturbation; None: measured per block (zo/blocks.py)
    direction: str = "rademacher"
    rounding: str = "nearest"
    batch: int = 32
    budget: int = 20000
    budget_ms: float | None = None  # set: the budget is this much estimated STM32N6 time (zo/cost.py)
    seed: int = 0
    eval_every: int | None = None  # forward passes between evaluations (default: budget / 20)
    checkpoint_every: int = 100  # steps
    profile: str = "tflm"
    train_size: int | None = None
    test_size: int | None = None
    new_head: bool = False  # a fresh head (appended to a model without a classifier)
    keep_head: bool = False  # keep the model's own head when the class count matches (else a fresh one)
    # Below the head: "activity" (its exact tail, then activity perturbation, zo/tail.py, zo/activity.py)
    # or "weights" (weight perturbation of every tensor below the head, zo/blocks.py); "local" / "guided":
    # the exact tail, then local losses below it (zo/local.py).
    estimator: str = "activity"
    local_layers: str = "all"  # --estimator local: every layer below the tail each step, or "round-robin"
    local_examples: int | None = None  # the local layers' weight gradients from this many of a batch
    head_gradient: str = "exact"  # the classifier's gradient: "exact" (zo/head_grad.py) or "zo"
    master: str = "float"  # "float" (a float64 master copy) or "none" (integer codes only)
    zo_subspace: str = "channels"  # what a ZO block perturbs (zo/blocks.py): channels' scalings or all
    keep: str = "best"  # the model written: "best" on a held-out part of the training data, or "last"
    head_init: str = DEFAULT_HEAD_INIT  # how a fresh head starts (zo/head_init.py)
    input_range: str = "auto"  # pixels -> model input (zo/inputs.py)
    mean: str | None = None  # "R,G,B", torchvision's convention, with std
    std: str | None = None

    def validate(self):
        if self.optimizer not in OPTIMIZERS:
            raise ZoError(f"--optimizer {self.optimizer!r}: expected one of {', '.join(OPTIMIZERS)}")
        if self.lr_schedule not in SCHEDULES:
            raise ZoError(f"--lr-schedule {self.lr_schedule!r}: expected one of {', '.join(SCHEDULES)}")
        if self.direction not in KINDS:
            raise ZoError(f"--direction {self.direction!r}: expected one of {', '.join(KINDS)}")
        if self.rounding not in ("nearest", "stochastic"):
            raise ZoError(f"--rounding {self.rounding!r}: expected nearest or stochastic")
        check_head_init(self.head_init)
        if self.eps is not None and self.eps < 1:
            raise ZoError(f"--eps {self.eps}: expected a positive number of int8 steps (or auto)")
        for name, value, allowed in (
            ("head-gradient", self.head_gradient, ("exact", "zo")),
            ("estimator", self.estimator, ("activity", "weights", "local", "guided")),
            ("master", self.master, ("float", "none")),
            ("local-layers", self.local_layers, ("all", "round-robin")),
            ("keep", self.keep, ("best", "last")),
            ("zo-subspace", self.zo_subspace, zo_blocks.SUBSPACES),
        ):
            if value not in allowed:
                raise ZoError(f"--{name} {value!r}: expected one of {', '.join(allowed)}")
        if self.new_head and self.keep_head:
            raise ZoError("--new-head and --keep-head: expected at most one of them")
        if self.budget_ms is not None and not (self.budget_ms > 0 and np.isfinite(self.budget_ms)):
            raise ZoError(f"--budget-ms {self.budget_ms}: expected a positive number of milliseconds")
        if self.local_examples is not None and self.local_examples < 1:
            raise ZoError(f"--local-examples {self.local_examples}: expected at least 1")
        if self.batch < 1:
            raise ZoError(f"--batch {self.batch}: expected at least 1")
        if self.lr is not None and not (self.lr > 0 and np.isfinite(self.lr)):
            raise ZoError(f"--lr {self.lr}: expected a positive finite learning rate")
        try:
            parse_scheduler(self.q)
        except ValueError as e:
            raise ZoError(str(e)) from None

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else default_lr(self.optimizer, self.head_init)

    def make_scheduler(self) -> Scheduler:
        """--q as a fresh scheduler; `qscheduler` resolved for this step rule, and for the hybrid
        trainer (the exact head with activity perturbation below its tail, whose layers take the head's
        Adam and whose steps pay a fixed cost on the M55) the rate rule derived for that cost (docs/zo.md)."""
        kind, colon, rest = self.q.partition(":")
        if self.estimator in ("local", "guided") and self.head_gradient == "exact" and kind == "qscheduler":
            return parse_scheduler("fixed:1")  # local losses have no q (zo/local.py)
        if kind == "qscheduler" and self.estimator == "activity" and self.head_gradient == "exact":
            return parse_scheduler("rate" + colon + rest)
        return parse_scheduler(self.q, OPTIMIZERS[self.optimizer].step_grows_with_q)
