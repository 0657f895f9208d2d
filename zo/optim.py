"""Optimizers on the master copy (float64, in integer steps of each tensor's own unit).

The gradient estimate they receive is in loss per integer step, so the learning rate of SGD is in
steps per unit gradient, and Adam's is (about) the largest step in integer units per update.
"""

from __future__ import annotations

import math

import numpy as np


def learning_rate(base: float, schedule: str, progress: float) -> float:
    """progress in [0, 1]: the fraction of the forward-pass budget spent."""
    if schedule == "constant":
        return base
    if schedule == "cosine":
        return base * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    if schedule == "linear":
        return base * max(1.0 - progress, 0.0)
    raise ValueError(f"unknown learning-rate schedule {schedule!r}")


SCHEDULES = ("constant", "cosine", "linear")
Q_REFERENCE = 4  # the q at which NormalizedSGD's lr is the rate itself


class SGD:
    """SGD with (heavy-ball) momentum."""

    step_grows_with_q = False  # whether a step at q is q / Q_REFERENCE times the rate (NormalizedSGD)

    def __init__(self, size: int, momentum: float = 0.9):
        self.momentum = momentum
        self.velocity = np.zeros(size)

    def step(
        self, grad: np.ndarray, lr: float, derivatives: np.ndarray | None = None, step_q: int | None = None
    ) -> np.ndarray:
        self.velocity = self.momentum * self.velocity + grad
        return -lr * self.velocity

    def state(self) -> dict:
        return {"velocity": self.velocity}

    def load(self, state: dict):
        self.velocity = np.array(state["velocity"], dtype=np.float64)


class NormalizedSGD(SGD):
    """SGD with momentum on the estimate divided by the RMS of its own directional derivatives d_i,
    with a step that grows linearly with q.

    FZOO's scale-free step: E[d_i^2] = |grad|^2 (+ data noise) for Rademacher directions, so the
    normalized estimate has a size that does not depend on the loss's scale, the model or the
    layer's units. One lr fits models whose raw gradients differ by orders of magnitude, and unlike
    Adam, coordinates whose estimate is pure noise are not blown up to a full step each.

    lr is the rate at q = Q_REFERENCE; at q it is lr * q / Q_REFERENCE: the linear scaling rule of
    batch size (Goyal et al. 2017; Smith et al. 2018), with the q directions as the batch. A step
    averages q estimates, so its noise variance falls as 1/q while steps per forward pass fall as
    1/q too: the q-fold step keeps the signal and the noise per forward pass where they were, and a
    scheduler that raises q trades many small steps for fewer clean ones instead of slowing down.
    """

    step_grows_with_q = True

    def step(
        self, grad: np.ndarray, lr: float, derivatives: np.ndarray | None = None, step_q: int | None = None
    ) -> np.ndarray:
        """step_q: the q whose step to take (default: the q of the estimate, len(derivatives))."""
        if derivatives is None or not len(derivatives):
            return super().step(grad, lr)
        rms = float(np.sqrt(np.mean(np.square(derivatives))))
        scaled = lr * (step_q or len(derivatives)) / Q_REFERENCE
        return super().step(grad / rms if rms > 0 else grad, scaled)


class Adam:
    """ZO-Adam: Adam's moment estimates on the ZO gradient estimate."""

    step_grows_with_q = False

    def __init__(self, size: int, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.m = np.zeros(size)
        self.v = np.zeros(size)
        self.t = 0

    def step(
        self, grad: np.ndarray, lr: float, derivatives: np.ndarray | None = None, step_q: int | None = None
    ) -> np.ndarray:
        self.t += 1
        self.m = self.beta1 * self.m + (1 - self.beta1) * grad
        self.v = self.beta2 * self.v + (1 - self.beta2) * grad * grad
        m_hat = self.m / (1 - self.beta1**self.t)
        v_hat = self.v / (1 - self.beta2**self.t)
        return -lr * m_hat / (np.sqrt(v_hat) + self.eps)

    def state(self) -> dict:
        return {"m": self.m, "v": self.v, "t": np.array(self.t)}

    def load(self, state: dict):
        self.m = np.array(state["m"], dtype=np.float64)
        self.v = np.array(state["v"], dtype=np.float64)
        self.t = int(state["t"])


OPTIMIZERS = {"nsgd": NormalizedSGD, "sgd": SGD, "adam": Adam}


def make_optimizer(name: str, size: int, momentum: float):
    """A fresh optimizer of the named kind over size coordinates (momentum for the SGD kinds)."""
    return OPTIMIZERS[name](size) if name == "adam" else OPTIMIZERS[name](size, momentum=momentum)
