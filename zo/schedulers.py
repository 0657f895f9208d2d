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


def loss_slope(losses: list[float]) -> tuple[float, float]:
    """Least-squares slope of a run of per-step losses (loss per step) and its standard error, from
    the residual scatter of the losses themselves."""
    y = np.asarray(losses, dtype=np.float64)
    x = np.arange(y.size, dtype=np.float64)
    x -= x.mean()
    sxx = float((x * x).sum())
    slope = float((x * (y - y.mean())).sum() / sxx)
    resid = y - y.mean() - slope * x
    return slope, math.sqrt(float((resid * resid).sum()) / (y.size - 2) / sxx)


class Scheduler:
    name = "scheduler"

    def next_q(self, progress: Progress) -> int:
        raise NotImplementedError

    def probe_batches(self, progress: Progress) -> int:
        """Mini-batches the next step probes with the same q directions: 1, or 2 for a paired step
        (whose update averages both batches; it costs 4q passes)."""
        return 1

    def step_q(self, q: int) -> int:
        """The q whose step length the optimizer should take (NormalizedSGD's linear scaling): q
        itself, or a fixed q for a rule that holds the step length while q grows (coupled)."""
        return q

    def measure_step(self, progress: Progress) -> bool:
        """Whether the trainer should measure the Taylor terms of the step about to be taken (3
        forward passes on an independent mini-batch; observe_taylor receives them)."""
        return False

    def observe_taylor(self, progress: Progress, first: float, second: float):
        """The step's first- and second-order loss terms, -g . dw and dw' H dw / 2, when measure_step
        asked for them (called before observe)."""

    def observe(self, progress: Progress, q: int, loss_plus: np.ndarray, loss_minus: np.ndarray):
        """Called after every step with its probe losses: shape [q], or [batches, q] for a paired step."""

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


class SequentialTest(Scheduler):
    """What the slope and efficiency tests share: q from q_init within [q_min, q_max], the per-step
    training losses since the last decision (the mean of each probe pair's L+ and L-, free: those
    passes are run anyway), a decision every `window` steps at z standard errors, collections that
    grow up to `max_windows` windows while undecided, and the q changes for plots and logs."""

    def __init__(self, q_init: int, q_max: int, window: int, z: float, max_windows: int, q_min: int):
        self.q, self.q_max, self.q_min = q_init, q_max, q_min
        self.window, self.z, self.max_windows = window, z, max_windows
        self.losses: list[float] = []
        self.changes: list[tuple[int, int]] = []  # (step, new q), for plots and logs

    def next_q(self, progress):
        return self.q

    def record(self, loss_plus, loss_minus) -> bool:
        """Collect the step's training loss; True when a window closes and a decision is due."""
        self.losses.append(float(np.mean((np.asarray(loss_plus) + np.asarray(loss_minus)) / 2)))
        return len(self.losses) % self.window == 0

    def double(self, progress: Progress):
        """q doubles, up to q_max, while the budget left still pays for one window at the new q."""
        remaining = progress.budget - progress.forward_passes
        if self.q < self.q_max and 2 * (2 * self.q) * self.window <= remaining:
            self.q = min(2 * self.q, self.q_max)
            self.changes.append((progress.step, self.q))

    def halve(self, progress: Progress):
        self.q = max(self.q // 2, self.q_min)
        self.changes.append((progress.step, self.q))

    def undecided_too_long(self) -> bool:
        return len(self.losses) >= self.max_windows * self.window

    def describe(self):
        return f"{self.name}:{self.q_max}"


class SlopeTest(SequentialTest):
    """Adaptive q (QScheduler v2): start small, double q once the loss has *confidently* stopped
    improving.

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

    name = "slope"

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
        super().__init__(q_init, q_max, window, z, max_windows, q_min)
        self.threshold, self.shrink = threshold, shrink

    def improvement_bounds(self) -> tuple[float, float, float]:
        """(lower, upper) confidence bounds of the loss improvement per window, and the current loss
        (the mean of the last window)."""
        slope, se = loss_slope(self.losses)
        return (
            (-slope - self.z * se) * self.window,
            (-slope + self.z * se) * self.window,
            float(np.mean(self.losses[-self.window :])),
        )

    def observe(self, progress, q, loss_plus, loss_minus):
        if not self.record(loss_plus, loss_minus):
            return
        lower, upper, level = self.improvement_bounds()
        if upper < self.threshold * level:
            self.losses = []
            self.double(progress)
        elif lower > self.threshold * level or self.undecided_too_long():
            self.losses = []
            if self.shrink is not None and lower > self.shrink * level and self.q > self.q_min:
                self.halve(progress)

    def state(self):
        return {"q": self.q, "losses": self.losses, "changes": self.changes}

    def load(self, state):
        self.q = int(state["q"])
        self.losses = [float(v) for v in state["losses"]]
        self.changes = [tuple(c) for c in state["changes"]]


class CoupledSlopeTest(SlopeTest):
    """The slope test with the step length held: q doubles on a confident plateau, but the optimizer
    keeps the step of q_init (step_q), so a doubling halves the noise of every step instead of
    doubling its length. Under NormalizedSGD's linear scaling a larger q keeps signal and noise per
    forward pass where they were (q alone changes nothing to first order); holding the step makes
    the doubling what "increase the batch size instead of decaying the learning rate" means: the
    drift per pass halves and the noise per pass falls fourfold, at the same cost per pass."""

    name = "coupled"

    def __init__(self, q_init: int = 4, q_max: int = 64, **kw):
        super().__init__(q_init=q_init, q_max=q_max, **kw)
        self.q_init = q_init

    def step_q(self, q: int) -> int:
        return self.q_init


class SignalToNoise(Scheduler):
    """q from the gradient's signal-to-noise ratio, measured with the probes' own directional
    derivatives (a norm test in the spirit of Byrd et al. 2012, adapted to random directions).

    Every `every`-th step is paired: the same q directions u_i are probed on two mini-batches A and
    B, giving d_i and d'_i (the update averages both, so the passes are not lost). For Rademacher
    directions E[d_i d'_i] = g_A . g_B, whose expectation over batches is |g|^2 (the signal: data
    noise of independent batches cancels), while E[(d_i - d'_i)^2] / 2 is the data noise of one
    batch, tr(Sigma) / B. Their ratio R = noise / signal is the gradient noise scale over the batch
    (McCandlish et al. 2018), summed over `window` paired steps. The naive vector norm test would
    compare the estimate's variance with |g|^2; for random directions that variance is dominated by
    direction noise ~ (d / q) (|g|^2 + noise), so it would ask for q ~ d. Instead q keeps the
    estimate's noise-to-signal ratio where it was at the first measurement (big-batch SGD, De et al.
    2017): (d / q) (1 + R) constant gives q = q_init (1 + R) / (1 + R_0), as a power of two, never
    decreasing, within q_max, and only while the budget left pays for one window at the new q. The
    step length is held at q_init's (step_q), as in CoupledSlopeTest: the growth of q is the
    annealing."""

    name = "snr"

    def __init__(self, q_init: int = 4, q_max: int = 64, every: int = 4, window: int = 50):
        self.q, self.q_init, self.q_max, self.every, self.window = q_init, q_init, q_max, every, window
        self.signal, self.noise, self.paired = 0.0, 0.0, 0
        self.baseline: float | None = None  # 1 + R_0
        self.steps = 0
        self.changes: list[tuple[int, int]] = []

    def next_q(self, progress):
        return self.q

    def probe_batches(self, progress):
        return 2 if progress.step % self.every == self.every - 1 else 1

    def step_q(self, q):
        return self.q_init

    def observe(self, progress, q, loss_plus, loss_minus):
        d = np.asarray(loss_plus, dtype=np.float64) - np.asarray(loss_minus, dtype=np.float64)
        if d.ndim != 2 or d.shape[0] != 2:
            return
        # eps cancels in the ratio: (L+ - L-) stands for 2 eps d_i
        self.signal += float(np.mean(d[0] * d[1]))
        self.noise += float(np.mean((d[0] - d[1]) ** 2)) / 2.0
        self.paired += 1
        if self.paired < self.window:
            return
        ratio = 1.0 + self.noise / self.signal if self.signal > 0 else math.inf
        self.signal, self.noise, self.paired = 0.0, 0.0, 0
        if self.baseline is None:
            self.baseline = ratio if math.isfinite(ratio) else None
            return
        target = self.q_init * ratio / self.baseline if math.isfinite(ratio) else self.q_max
        new_q = self.q
        while 2 * new_q <= min(target * math.sqrt(2), self.q_max):  # the power of two nearest target
            new_q *= 2
        remaining = progress.budget - progress.forward_passes
        window_passes = 2 * new_q * self.every * self.window  # about one window of steps at new_q
        if new_q > self.q and window_passes <= remaining:
            self.q = new_q
            self.changes.append((progress.step, self.q))

    def state(self):
        return {
            "q": self.q,
            "signal": self.signal,
            "noise": self.noise,
            "paired": self.paired,
            "baseline": self.baseline,
            "changes": self.changes,
        }

    def load(self, state):
        self.q = int(state["q"])
        self.signal, self.noise, self.paired = (
            float(state["signal"]),
            float(state["noise"]),
            int(state["paired"]),
        )
        self.baseline = None if state["baseline"] is None else float(state["baseline"])
        self.changes = [tuple(c) for c in state["changes"]]

    def describe(self):
        return f"{self.name}:{self.q_max}"


class EfficiencyTest(SequentialTest):
    """Adaptive q (QScheduler v3): double q when the noise of the estimate, not the rate, is what
    holds back the decrease per forward pass.

    To second order a step lowers the loss by p = A - C: A = -g . dw its first-order term, C =
    dw' H dw / 2 what it loses to curvature. For a step whose length does not depend on q (sgd,
    adam) and q much smaller than the number of parameters, C is the cost of the estimate's
    direction noise, whose variance falls as 1/q: p(q) = A - B/q with C = B/q. Doubling q raises the
    decrease per forward pass, p / 2q, exactly when p(2q) > 2 p(q), that is when C > 2p; halving
    pays when p > 2C. Both are measured, not modelled:
    - p: the slope of the per-step training losses since the last decision (free: the mean of the
      probe pairs, as in the slope test), with its standard error;
    - C: on every `every`-th step, the second difference of the loss along the step's own update,
      at the point it starts from, on an independent mini-batch (3 forward passes), where `every`
      keeps those passes at `overhead` of the steps' 2q.
    Every `window` steps the test asks, at z standard errors, whether C - 2p > 0 (double) or p - 2C
    > 0 (halve); undecided collections keep growing (a sequential test) up to `max_windows`
    windows. Slow but clean progress (C small against p) never reads as a plateau: the threshold
    is what the noise costs, not a fraction of the loss. q only grows while the budget left pays for
    one window at the new q.
    """

    name = "efficiency"

    def __init__(
        self,
        q_init: int = 1,
        q_max: int = 64,
        window: int = 400,
        z: float = 2.0,
        max_windows: int = 10,
        overhead: float = 0.02,
        q_min: int = 1,
    ):
        super().__init__(q_init, q_max, window, z, max_windows, q_min)
        self.overhead = overhead
        self.costs: list[float] = []  # C of the measured steps

    def every(self) -> int:
        """Steps between measurements: 3 passes per measurement, 2q per step."""
        return max(1, math.ceil(3 / (2 * self.overhead * self.q)))

    def measure_step(self, progress):
        return progress.step % self.every() == 0

    def observe_taylor(self, progress, first, second):
        self.costs.append(float(second))

    def observe(self, progress, q, loss_plus, loss_minus):
        if not self.record(loss_plus, loss_minus) or len(self.costs) < 2:
            return
        slope, slope_se = loss_slope(self.losses)
        costs = np.asarray(self.costs)
        cost, cost_se = float(costs.mean()), float(costs.std(ddof=1)) / math.sqrt(costs.size)
        noise_bound = cost - 2 * (-slope)  # > 0: the noise costs more than twice the progress
        clean = -slope - 2 * cost  # > 0: the progress is more than twice the noise's cost
        if noise_bound - self.z * math.hypot(cost_se, 2 * slope_se) > 0:
            self.losses, self.costs = [], []
            self.double(progress)
        elif clean - self.z * math.hypot(slope_se, 2 * cost_se) > 0 and self.q > self.q_min:
            self.losses, self.costs = [], []
            self.halve(progress)
        elif self.undecided_too_long():
            self.losses, self.costs = [], []

    def state(self):
        return {"q": self.q, "losses": self.losses, "costs": self.costs, "changes": self.changes}

    def load(self, state):
        self.q = int(state["q"])
        self.losses = [float(v) for v in state["losses"]]
        self.costs = [float(v) for v in state["costs"]]
        self.changes = [tuple(c) for c in state["changes"]]


# -- q against a step's fixed cost (QScheduler v5; the derivation is in docs/zo.md) ------------------
def progress_rate(
    q: float, signal: float, noise: float, fixed: float, per_direction: float, exact: float = 0.0
) -> float:
    """Expected loss decrease per unit of cost, up to the constant 1 / 2L, of a step that moves the
    exact layers along their gradient and the estimated layers along the mean of q directions' estimates:
    (E + q s^2 / (q s + v)) / (C_s + q C_p). E = |g_exact|^2 (the exact head and tail, whose progress a
    step makes whatever q is), s = |g|^2 of the estimated layers (data noise included, as in E), v the
    variance of one direction's estimate, C_s the step's fixed cost, C_p a direction's."""
    estimated = q * signal * signal / (q * signal + noise) if signal > 0 else 0.0
    return (exact + estimated) / (fixed + q * per_direction)


def best_q(
    signal: float, noise: float, fixed: float, per_direction: float, q_max: int = 64, exact: float = 0.0
) -> int:
    """The integer q in [1, q_max] of the largest progress_rate. With r = v / s, k = C_s / C_p and
    e = E / s the continuous optimum is q* = (sqrt(r (k (1 + e) - e r)) - e r) / (1 + e) (docs/zo.md;
    sqrt(r k) without an exact part), and the rate is unimodal in q, so the best integer is floor(q*) or
    ceil(q*); where e >= k / r (the exact part's progress outweighs what a direction more could add)
    the rate falls from q = 1 on. No signal measured above zero (noise swamps it): q_max without an
    exact part, 1 with one (only the exact part's progress is known, and it does not grow with q)."""
    if per_direction <= 0:
        raise ValueError(f"per-direction cost {per_direction}: expected > 0")
    if exact < 0:
        raise ValueError(f"exact part's signal {exact}: expected >= 0 (a squared norm)")
    if signal <= 0:
        return 1 if exact > 0 else q_max
    if noise <= 0 or fixed <= 0:
        return 1
    r, k, e = noise / signal, fixed / per_direction, exact / signal
    inside = r * (k * (1 + e) - e * r)
    if inside <= 0:
        return 1
    star = (math.sqrt(inside) - e * r) / (1 + e)
    if star <= 1:
        return 1
    candidates = {min(max(c, 1), q_max) for c in (math.floor(star), math.ceil(star))}
    return max(
        sorted(candidates), key=lambda q: progress_rate(q, signal, noise, fixed, per_direction, exact)
    )


def direction_statistics(total: np.ndarray, squares: float, q: int) -> tuple[float, float]:
    """(signal, noise) from one step's q per-direction estimates g_i, given streamed as their sum
    `total` = sum g_i and `squares` = sum |g_i|^2 (nothing per direction is kept). noise: the
    unbiased variance of one direction's estimate about their mean, (sum |g_i - m|^2) / (q - 1);
    signal: |m|^2 - noise / q, unbiased for |E m|^2 = |g|^2 (the batch's gradient, so data noise
    is in it, which a larger q does not average away). Needs q >= 2."""
    if q < 2:
        raise ValueError("direction_statistics needs q >= 2 directions")
    mean_sq = float(np.dot(total, total)) / q**2
    noise = (squares - q * mean_sq) / (q - 1)
    return mean_sq - noise / q, max(noise, 0.0)


def split_half_statistics(half_a: np.ndarray, half_b: np.ndarray, q: int) -> tuple[float, float]:
    """(signal, noise) as direction_statistics gives them, from two half-sums of the q estimates
    (directions 0..q/2-1 and q/2..q-1; q even): for an estimator whose per-direction vectors are never
    formed one by one (activity perturbation forms one weight gradient from all directions' output
    gradients; two halves cost one local gradient more, on the steps that measure). With means A and
    B of q/2 estimates each, E|A - B|^2 = 4 v / q and E[A . B] = |g|^2."""
    if q < 2 or q % 2:
        raise ValueError("split_half_statistics needs an even q >= 2")
    a, b = np.asarray(half_a) / (q // 2), np.asarray(half_b) / (q // 2)
    diff = a - b
    return float(np.dot(a, b)), q * float(np.dot(diff, diff)) / 4


def two_means_statistics(mean_a: np.ndarray, mean_b: np.ndarray, qa: int, qb: int) -> tuple[float, float]:
    """(signal, noise) as direction_statistics gives them, from the means A and B of two independent
    groups of qa and qb per-direction estimates: E[A . B] = |g|^2, E|A - B|^2 = v (1/qa + 1/qb)."""
    if qa < 1 or qb < 1:
        raise ValueError("two_means_statistics needs at least one estimate in each group")
    a, b = np.asarray(mean_a, dtype=np.float64), np.asarray(mean_b, dtype=np.float64)
    diff = a - b
    return float(np.dot(a, b)), float(np.dot(diff, diff)) / (1.0 / qa + 1.0 / qb)


class ProgressRate(Scheduler):
    """QScheduler v5: q maximising the whole step's expected progress per unit of cost, the exact
    layers' included, from measured statistics (docs/zo.md, "How many directions a step").

    The trainer reports each step's per-direction statistics (observe_estimates: signal and noise
    from direction_statistics or two_means_statistics, summed over the steps where q >= 2, and the
    exact head's and tail's |g|^2 on the same steps) and the step's cost split into what it pays once
    and what each direction adds, and for the hybrid trainer what a step of the exact part alone costs
    (observe_costs: device seconds under --budget-ms, forward passes under --budget). Every `window`
    measured steps q = best_q(resolved signal, sum noise, fixed, per direction, exact=sum exact).

    The rule acts on what the measurements resolve: the signal it weighs is the lower confidence bound
    of the window's summed signal, z standard errors of that sum below it (its standard error from
    the spread of the window's own per-step signals). An estimate whose spread swamps it counts as no
    signal, so it neither drives q up nor buys a step's cost.
    Skip (q = 0): where a step with the estimated layers, at the best q and the resolved signal, makes
    less progress per unit of cost than a step of the exact head and tail alone (E / C_exact), the
    estimated layers are left out of the steps, and only measured: a whole round robin of them (one
    layer a step) at q = 2 once every `interval` rounds, the interval doubling at each window that
    decides to skip again, while the evidence keeps accumulating (a sequential test: undecided windows
    are not thrown away). The hybrid trainer starts so, since nothing is resolved before its first
    window. No tuned constant enters the rule: window only sets how many steps a ratio of sums
    averages over, z = 2 the confidence of the bounds the trainer uses elsewhere (zo/keep.py). While q
    is 1 no spread can be measured, so the measuring steps then probe 2 directions (their estimate is
    used; it costs one direction more). `notes` holds one line for each change between estimating and
    skipping, for the trainer to print."""

    name = "rate"
    wants_estimates = True

    def __init__(self, q_max: int = 64, q_init: int = 2, window: int = 20, every: int = 10, z: float = 2.0):
        self.q, self.q_max, self.window, self.every, self.z = q_init, q_max, window, every, z
        self.signal, self.signal_sq, self.noise, self.exact, self.measured = 0.0, 0.0, 0.0, 0.0, 0
        self.fixed, self.per_direction, self.exact_only, self.layers = 0.0, 1.0, 0.0, 1
        self.skipping: bool | None = None  # None until the costs say whether an exact part alone can step
        self.interval = every  # rounds of the round robin between measuring rounds
        self.changes: list[tuple[int, int]] = []
        self.notes: list[str] = []

    def next_q(self, progress):
        if self.skipping:
            return 2 if self.measures(progress.step) else 0
        if self.q == 1 and self.measures(progress.step):
            return 2
        return self.q

    def measures(self, step: int) -> bool:
        """Whether an estimator that pays to measure (activity perturbation's second local gradient,
        zo/activity_step.py) measures at this step: every step of one round robin of the `layers`
        estimated layers in `interval` (`every` while estimating), the steps where q = 1 takes 2."""
        period = self.interval if self.skipping else self.every
        return (step // max(self.layers, 1)) % period == period - 1

    def observe_costs(self, fixed: float, per_direction: float, exact_only: float = 0.0, layers: int = 1):
        """C_s and C_p; exact_only: what a step of the exact head and tail alone costs (0: none can
        step alone, the rule never skips); layers: the estimated layers taking turns a step."""
        self.fixed, self.per_direction = float(fixed), float(per_direction)
        self.exact_only, self.layers = float(exact_only), max(int(layers), 1)
        if self.skipping is None and self.exact_only > 0 and layers > 0:
            self.skipping = True
            self.notes.append(
                "the estimated layers below the exact tail are only measured (one round of them at "
                f"q = 2 every {self.interval} rounds) until their signal is resolved above its noise"
            )

    def resolved_signal(self) -> float:
        """The window's summed signal less z standard errors of that sum (from its per-step spread)."""
        n = self.measured
        if n < 2:
            return -math.inf
        variance = max(self.signal_sq - self.signal**2 / n, 0.0) / (n - 1)
        return self.signal - self.z * math.sqrt(n * variance)

    def observe_estimates(self, progress: Progress, signal: float, noise: float, exact: float = 0.0):
        """One measured step: the estimated layers' signal and noise, and exact = |g|^2 of the layers
        the same step moves along their exact gradient, in the same units (0: none, or not commensurable)."""
        self.signal += signal
        self.signal_sq += signal * signal
        self.noise += noise
        self.exact += exact
        self.measured += 1
        if self.measured % self.window:
            return
        resolved = self.resolved_signal()
        q = best_q(resolved, self.noise, self.fixed, self.per_direction, self.q_max, exact=self.exact)
        with_layers = progress_rate(q, resolved, self.noise, self.fixed, self.per_direction, self.exact)
        alone = self.exact / self.exact_only if self.exact_only > 0 else 0.0
        if self.exact > 0 and with_layers < alone:
            if self.skipping:
                self.interval *= 2
            else:
                self.skipping, self.interval = True, self.every
                self.changes.append((progress.step, 0))
                self.notes.append(self.skip_note(progress.step, resolved, with_layers, alone))
            return  # the evidence keeps accumulating while the layers are skipped
        if self.skipping:
            self.notes.append(
                f"step {progress.step}: the estimated layers train again (q = {q}): their resolved signal "
                f"makes a step with them worth its cost ({with_layers:.3g} against {alone:.3g} a unit alone)"
            )
            self.changes.append((progress.step, q))
        elif q != self.q:
            self.changes.append((progress.step, q))
        self.skipping, self.interval, self.q = False, self.every, q
        self.signal, self.signal_sq, self.noise, self.exact, self.measured = 0.0, 0.0, 0.0, 0.0, 0

    def skip_note(self, step: int, resolved: float, with_layers: float, alone: float) -> str:
        signal = "no signal resolved above its noise" if resolved <= 0 else "too little signal"
        return (
            f"step {step}: the estimated layers are skipped ({signal} over {self.measured} measured "
            f"steps): a step with them makes {with_layers:.3g} progress a unit of cost against the exact "
            f"head and tail alone's {alone:.3g}; the budget goes to the exact part, and they are measured "
            "ever more rarely"
        )

    def state(self):
        return {
            "q": self.q, "signal": self.signal, "signal_sq": self.signal_sq, "noise": self.noise,
            "exact": self.exact, "measured": self.measured, "fixed": self.fixed,
            "per_direction": self.per_direction, "exact_only": self.exact_only, "layers": self.layers,
            "skipping": self.skipping, "interval": self.interval, "changes": self.changes,
        }  # fmt: skip

    def load(self, state):
        self.q, self.measured = int(state["q"]), int(state["measured"])
        self.signal, self.noise = float(state["signal"]), float(state["noise"])
        self.exact = float(state.get("exact", 0.0))  # checkpoints from before the exact part was weighed
        # checkpoints from before the resolved signal and the skip: no spread (the window restarts
        # its bound), no skip decided yet
        self.signal_sq = float(state.get("signal_sq", 0.0))
        self.exact_only, self.layers = float(state.get("exact_only", 0.0)), int(state.get("layers", 1))
        self.skipping, self.interval = state.get("skipping"), int(state.get("interval", self.every))
        self.fixed, self.per_direction = float(state["fixed"]), float(state["per_direction"])
        self.changes = [tuple(c) for c in state["changes"]]

    def describe(self):
        return f"{self.name}:{self.q_max}"


ADAPTIVE = {
    "slope": SlopeTest,
    "coupled": CoupledSlopeTest,
    "snr": SignalToNoise,
    "efficiency": EfficiencyTest,
    "rate": ProgressRate,
}
# The rule `--q qscheduler` names, by whether the step rule's step grows with q (how each was chosen:
# experiments/results/earlier-studies.md). Under nsgd's linear scaling q is first-order neutral and
# the slope test keeps q off the edges; under a step that does not grow with q, the efficiency
# test's thresholds hold.
QSCHEDULER = {True: "slope", False: "efficiency"}


def parse_scheduler(spec: str, step_grows_with_q: bool = True) -> Scheduler:
    """fixed:N | qscheduler[:q_max] | slope|coupled|snr|efficiency|rate[:q_max] | linear[:q_max] |
    power[:q_max]

    step_grows_with_q: the step rule's (zo/optim.py), which `qscheduler` is resolved for."""
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
        kind = QSCHEDULER[step_grows_with_q]
    if kind in ADAPTIVE:
        return ADAPTIVE[kind](q_max=n or 64)
    if kind == "linear":
        return LinearRamp(q_max=n or 32)
    if kind == "power":
        return PowerLaw(q_max=n or 32)
    raise ValueError(
        f"--q {spec!r}: expected fixed:N, qscheduler[:QMAX], slope|coupled|snr|efficiency|rate[:QMAX], "
        "linear[:QMAX] or power[:QMAX]"
    )
