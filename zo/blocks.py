"""Where ZO spends its forward passes: the trainable tensors below the head, one block each, each
with its own perturbation size, in a subspace the budget can resolve.

Per block, not one global vector, because one global normalization let the head drown every layer
below it (its 10 biases held 86% of ResNet-8's squared gradient norm, docs/zo.md): a step perturbs
one block (round robin, as LeZO perturbs a subset of layers per step), and the step rule normalizes
by that block's own directional derivatives.

eps per block, because an int8 central difference at 1 LSB below the head is mostly rounding noise
(correlation 0.41-0.68 with the float directional derivative on ResNet-8; 0.80-0.93 at 4 LSB).
The trainer measures it forward-only before the first step, with the passes charged to the budget:
on one mini-batch and the same directions, d(eps) and d(2 eps). The loss's rounding noise is
independent between the two sizes and its contribution to d falls 4x in variance at 2 eps, while
the derivative is common to both; so mean(d(eps) d(2eps)) / mean(d(eps)^2) estimates the squared
correlation of d(eps) with the true derivative. The block takes the smallest eps that reaches
MIN_CORRELATION (a larger eps also measures curvature: the smallest that resolves is the best).

The subspace (`--zo-subspace`). A random direction over d coordinates carries sqrt(q/d) of the
gradient per step: over a convolution's 36,864 weights (ResNet-8's conv2d_7) the weights walked at
random (cosine 0.047 with the gradient after 20k passes). So by default a weight tensor is
perturbed along its own output channels' scalings, w_c -> w_c (1 + s_c t), one coordinate per
channel (64 instead of 36,864; the direction of channel c is w_c / max|w_c|, so eps moves its
largest code by eps LSB), as training a normalization layer's scale does; biases are already one
per channel. `full` perturbs every weight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SUBSPACES = ("channels", "full")
EPS_CANDIDATES = (1, 2, 4, 8, 16)
CALIBRATION_DIRECTIONS = 16
MIN_CORRELATION = 0.85


@dataclass
class Block:
    name: str
    start: int  # positions in the trainer's flat vector of trainable values
    end: int
    eps: int = 1
    correlation: float = float("nan")  # the estimate at the chosen eps
    shape: tuple = ()  # the tensor's shape
    channel_axis: int | None = None  # set: perturbed along its channels' scalings (module docstring)

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def dims(self) -> int:
        """Coordinates of the block's perturbations: channels, or every value."""
        return self.size if self.channel_axis is None else self.shape[self.channel_axis]

    def _directions(self, values: np.ndarray) -> np.ndarray:
        """Per channel w_c / max|w_c|, in the tensor's shape (zero for an all-zero channel)."""
        w = values.reshape(self.shape).astype(np.float64)
        axes = tuple(a for a in range(w.ndim) if a != self.channel_axis)
        peak = np.max(np.abs(w), axis=axes, keepdims=True)
        return np.divide(w, peak, out=np.zeros_like(w), where=peak > 0)

    def delta(self, u: np.ndarray, values: np.ndarray, eps: int, units: np.ndarray) -> np.ndarray:
        """The integer perturbation of size eps along u (dims entries) at the block's values."""
        if self.channel_axis is None:
            return eps * units.astype(np.int64) * u
        shape = [1] * len(self.shape)
        shape[self.channel_axis] = -1
        moved = eps * u.reshape(shape) * self._directions(values)
        return np.rint(moved).astype(np.int64).ravel()

    def project(self, g: np.ndarray, values: np.ndarray) -> np.ndarray:
        """A gradient over the block's values as one over its dims (the transpose of lift): what the
        block's perturbations can measure of it."""
        if self.channel_axis is None:
            return g
        axes = tuple(a for a in range(len(self.shape)) if a != self.channel_axis)
        return np.sum(g.reshape(self.shape) * self._directions(values), axis=axes)

    def lift(self, g: np.ndarray, values: np.ndarray) -> np.ndarray:
        """A gradient over the block's dims as a move of its values (the chain rule of delta)."""
        if self.channel_axis is None:
            return g
        shape = [1] * len(self.shape)
        shape[self.channel_axis] = -1
        return (g.reshape(shape) * self._directions(values)).ravel()


def estimated_correlation(d_eps: np.ndarray, d_double: np.ndarray) -> float:
    """Estimated correlation of d(eps) with the true directional derivative (module docstring)."""
    power = float(np.mean(np.square(d_eps)))
    if not power > 0:
        return 0.0
    return math.sqrt(min(max(float(np.mean(d_eps * d_double)) / power, 0.0), 1.0))


def choose_eps(derivatives: dict) -> tuple[int, float, dict]:
    """(eps, its estimated correlation, every candidate's) from {eps: d over the same directions},
    for eps in EPS_CANDIDATES and twice the last."""
    estimates = {
        e: estimated_correlation(derivatives[e], derivatives[2 * e])
        for e in EPS_CANDIDATES
        if 2 * e in derivatives
    }
    for e, r in estimates.items():
        if r >= MIN_CORRELATION:
            return e, r, estimates
    best = max(estimates, key=lambda e: estimates[e])
    return best, estimates[best], estimates


def calibration_sizes() -> list[int]:
    """Every perturbation size the calibration probes: the candidates and twice the largest."""
    return sorted(set(EPS_CANDIDATES) | {2 * e for e in EPS_CANDIDATES})


def measure_eps(blocks: list, ints: np.ndarray, units: np.ndarray, losses_at, direction, check) -> int:
    """Set each block's eps (choose_eps) from central differences on one mini-batch at every size of
    calibration_sizes(), CALIBRATION_DIRECTIONS directions a block; returns the forward passes spent.
    losses_at(stacked rows of the trainable integers) -> the batch loss of each row;
    direction(block index, i, dims) -> the i-th direction; check() between blocks (interrupts)."""
    n = CALIBRATION_DIRECTIONS
    passes = 0
    for k, block in enumerate(blocks):
        check()
        values, block_units = ints[block.start : block.end], units[block.start : block.end]
        dirs = [direction(k, i, block.dims) for i in range(n)]
        derivatives = {}
        for e in calibration_sizes():
            stacked = np.repeat(ints[None], 2 * n, axis=0)
            for i, u in enumerate(dirs):
                delta = block.delta(u, values, e, block_units)
                stacked[2 * i, block.start : block.end] += delta
                stacked[2 * i + 1, block.start : block.end] -= delta
            losses = losses_at(stacked)
            derivatives[e] = (losses[0::2] - losses[1::2]) / (2.0 * e)
            passes += 2 * n
        block.eps, block.correlation, _ = choose_eps(derivatives)
    return passes
