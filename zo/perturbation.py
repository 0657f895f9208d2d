"""Integer perturbation directions, regenerated from (seed, step, i) and never stored.

On the device the extra memory of a ZO step is then one seed, as in MeZO, whatever the number of
trainable parameters.
"""

from __future__ import annotations

import math

import numpy as np

KINDS = ("rademacher", "gaussian")


def direction(seed: int, step: int, i: int, size: int, kind: str = "rademacher") -> np.ndarray:
    """Direction u_i of step `step`: int8 entries, Rademacher (+-1) or a rounded standard normal."""
    rng = np.random.Generator(np.random.PCG64([seed, step, i]))
    if kind == "rademacher":
        return (rng.integers(0, 2, size, dtype=np.int8) * 2 - 1).astype(np.int8)
    return np.clip(np.rint(rng.standard_normal(size)), -127, 127).astype(np.int8)


def second_moment(kind: str) -> float:
    """E[u_j^2], so that E[u u^T] = second_moment * I and the estimator can be made unbiased."""
    if kind == "rademacher":
        return 1.0
    # P(round(Z) = k) = Phi(k + 1/2) - Phi(k - 1/2)
    phi = lambda z: 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))  # noqa: E731
    return sum(k * k * (phi(k + 0.5) - phi(k - 0.5)) for k in range(-12, 13))
