"""Schedulers for the number of gradient samples q: one small class each, one interface.

A scheduler sees what the trainer saw (the probe losses of each step, the step, the forward passes
spent of the budget) and answers q for the next step. Its state is a JSON-able dict, so a resumed
run continues with exactly the same decisions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass
class Progress:
    step: int  # steps done
    forward_passes: int  # forward passes spent
    budget: int  # forward-pass budget of the run

    @property
    def fraction(self) -> float:
        return min(self.forward_passes / self.budget, 1.0) if self.budget else 0.0


class Scheduler:
    name = "scheduler"

    def next_q(self, progress: Progress) -> int:
        raise NotImplementedError

    def observe(self, progress: Progress, q: int, loss_plus: np.ndarray, loss_minus: np.ndarray):
        """Called after every step with the 2q probe losses of that step."""

    def state(self) -> dict:
        return {}

    def load(self, state: dict):
        pass

    def describe(self) -> str:
        return self.name


class FixedQ(Scheduler):
    name = "fixed"

    def __init__(self, q: int):
        self.q = q

    def next_q(self, progress):
        return self.q

    def describe(self):
        return f"fixed:{self.q}"


class LinearRamp(Scheduler):
    """q grows linearly with the budget spent: q = max(q_min, floor(fraction * q_max)) (MeZO's n-SPSA ramp,
    with the fraction of the forward-pass budget standing for t / T)."""

    name = "linear"

    def __init__(self, q_max: int = 32, q_min: int = 1):
        self.q_max, self.q_min = q_max, q_min

    def next_q(self, progress):
        return max(self.q_min, min(self.q_max, math.floor(progress.fraction * self.q_max)))

    def describe(self):
        return f"linear:{self.q_max}"


class PowerLaw(Scheduler):
    """AdaZeta's power law by epoch, q_e = min(max(floor(a * e^b), 1), q_max),
    with b = ln(q_target / a) / ln(E).

    An "epoch" here is one of E equal slices of the forward-pass budget (the number of data epochs
    a budget buys depends on q itself, so it cannot be the clock of q)."""

    name = "power"

    def __init__(self, q_max: int = 32, a: float = 0.5, q_target: int | None = None, epochs: int = 10):
        self.q_max, self.a, self.epochs = q_max, a, epochs
        self.q_target = q_target or q_max
        self.b = math.log(self.q_target / a) / math.log(epochs)

    def next_q(self, progress):
        e = min(1 + math.floor(progress.fraction * self.epochs), self.epochs)
        return min(
            max(math.floor(self.a * e**self.b + 1e-9), 1), self.q_max
        )  # 1e-9: e^b may land a hair below an integer

    def describe(self):
        return f"power:{self.q_max}"


class QScheduler(Scheduler):
    """Adaptive q: start small, double q once the loss has *confidently* stopped improving.

    The per-step training loss (the mean of each probe pair's L+ and L-, free: those passes are run
    anyway) is collected since the last decision. Every `window` steps a line is fitted to all of it;
    its slope gives the improvement per window, with a confidence interval of z standard errors.
    - Upper bound below `threshold` x the current loss: the current q has reached the noise floor
      of its gradient estimate (a plateau): q doubles, up to q_max, and collection restarts.
    - Lower bound above it: clear progress; collection restarts to follow the current rate.
    - Neither: undecided, keep collecting (a sequential test: the interval narrows as the
      collection grows, up to `max_windows` windows, after which it restarts without a change).
    Deciding on confidence bounds is what keeps noise from escalating q: a noisy window widens the
    interval and waits, where a point estimate under a fixed threshold (the naive rule) fires on
    noise. Letting the collection grow is what lets a low, noisy loss still reach a decision.
    q only grows when the budget left still pays for one window at the new q. With shrink set, q
    halves while the lower bound exceeds shrink x the loss.
    """

    name = "qscheduler"

    def __init__(
        self,
        q_init: int = 1,
        q_max: int = 64,
        window: int = 400,
        z: float = 2.0,
        threshold: float = 0.04,
        max_windows: int = 10,
        shrink: float | None = None,
        q_min: int = 1,
    ):
        self.q, self.q_max, self.q_min = q_init, q_max, q_min
        self.window, self.z, self.threshold, self.max_windows, self.shrink = (
            window,
            z,
            threshold,
            max_windows,
            shrink,
        )
        self.losses: list[float] = []
        self.changes: list[tuple[int, int]] = []  # (step, new q), for plots and logs

    def next_q(self, progress):
        return self.q

    def improvement_bounds(self) -> tuple[float, float, float]:
        """(lower, upper) confidence bounds of the loss improvement per window, and the current loss
        (the mean of the last window)."""
        y = np.asarray(self.losses, dtype=np.float64)
        x = np.arange(y.size, dtype=np.float64)
        x -= x.mean()
        sxx = float((x * x).sum())
        slope = float((x * (y - y.mean())).sum() / sxx)
        resid = y - y.mean() - slope * x
        se = math.sqrt(float((resid * resid).sum()) / (y.size - 2) / sxx)
        return (
            (-slope - self.z * se) * self.window,
            (-slope + self.z * se) * self.window,
            float(y[-self.window :].mean()),
        )

    def observe(self, progress, q, loss_plus, loss_minus):
        self.losses.append(float(np.mean((np.asarray(loss_plus) + np.asarray(loss_minus)) / 2)))
        if len(self.losses) % self.window:
            return
        lower, upper, level = self.improvement_bounds()
        remaining = progress.budget - progress.forward_passes
        if upper < self.threshold * level:
            self.losses = []
            if self.q < self.q_max and 2 * (2 * self.q) * self.window <= remaining:
                self.q = min(2 * self.q, self.q_max)
                self.changes.append((progress.step, self.q))
        elif lower > self.threshold * level or len(self.losses) >= self.max_windows * self.window:
            self.losses = []
            if self.shrink is not None and lower > self.shrink * level and self.q > self.q_min:
                self.q = max(self.q // 2, self.q_min)
                self.changes.append((progress.step, self.q))

    def state(self):
        return {"q": self.q, "losses": self.losses, "changes": self.changes}

    def load(self, state):
        self.q = int(state["q"])
        self.losses = [float(v) for v in state["losses"]]
        self.changes = [tuple(c) for c in state["changes"]]

    def describe(self):
        return "qscheduler"


def parse_scheduler(spec: str) -> Scheduler:
    """fixed:N | qscheduler[:q_max] | linear[:q_max] | power[:q_max]"""
    kind, _, arg = spec.partition(":")
    try:
        n = int(arg) if arg else None
    except ValueError:
        n = -1
    if n is not None and n < 1:
        raise ValueError(f"--q {spec!r}: the number after ':' must be a positive integer")
    if kind == "fixed":
        if n is None:
            raise ValueError(f"--q {spec!r}: expected fixed:N with N >= 1")
        return FixedQ(n)
    if kind == "qscheduler":
        return QScheduler(q_max=n or 64)
    if kind == "linear":
        return LinearRamp(q_max=n or 32)
    if kind == "power":
        return PowerLaw(q_max=n or 32)
    raise ValueError(f"--q {spec!r}: expected fixed:N, qscheduler[:QMAX], linear[:QMAX] or power[:QMAX]")
