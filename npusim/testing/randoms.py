"""Random test parameters shared by the test files (scales, codes, weights, biases); oracle
re-exports them."""

from __future__ import annotations

import math

import numpy as np

from .builder import f32


def log_uniform(rng: np.random.Generator, lo: float, hi: float, size=None):
    return np.exp(rng.uniform(math.log(lo), math.log(hi), size))


def random_int8(rng: np.random.Generator, shape, mode: str = "uniform") -> np.ndarray:
    """Activations. mode: uniform over [-128, 127], 'extreme' (only -128 and 127), 'mixed'
    (uniform with about a quarter of the values at the extremes), 'narrow' (near 0)."""
    if mode == "extreme":
        return rng.choice(np.array([-128, 127], np.int8), size=shape)
    if mode == "narrow":
        return rng.integers(-8, 8, size=shape, dtype=np.int8)
    x = rng.integers(-128, 128, size=shape, dtype=np.int8)
    if mode == "mixed":
        m = rng.random(shape) < 0.25
        x[m] = rng.choice(np.array([-128, 127], np.int8), size=int(m.sum()))
    return x


def random_weights(rng: np.random.Generator, shape, mode: str = "uniform") -> np.ndarray:
    """int8 weights in [-127, 127]; mode 'extreme' gives only +-127, 'narrow' [-3, 3]."""
    if mode == "narrow":
        return rng.integers(-3, 4, size=shape, dtype=np.int8)
    if mode == "extreme":
        return rng.choice(np.array([-127, 127], np.int8), size=shape)
    w = rng.integers(-127, 128, size=shape, dtype=np.int8)
    if mode == "mixed":
        m = rng.random(shape) < 0.25
        w[m] = rng.choice(np.array([-127, 127], np.int8), size=int(m.sum()))
    return w


def random_out_scale(rng: np.random.Generator, in_scale, w_scale, taps: int, max_mult: float = 0.999):
    """An output scale that keeps every per-channel multiplier in_scale*w_scale[c]/out_scale below
    max_mult (checked on the float32 values, in double) and puts the typical accumulator in the int8
    range give or take a factor of ~10 (so outputs are neither all saturated nor all zero)."""
    ws = np.atleast_1d(f32(w_scale)).astype(np.float64)
    s_in = float(np.float32(in_scale))
    # |acc| ~ 127*75*sqrt(taps) for uniform data; aim for ~64 LSB at the output.
    typical = 64.0 / (127.0 * 75.0 * math.sqrt(max(taps, 1)))
    m = float(log_uniform(rng, typical / 8, min(typical * 8, max_mult)))
    out = np.float32(s_in * float(np.median(ws)) / m)
    for _ in range(100):
        if np.all(s_in * ws / np.float64(out) < max_mult):
            break
        out = np.float32(out * 1.25)
    return float(out)


def random_bias(rng: np.random.Generator, n: int, taps: int, mode: str = "uniform") -> np.ndarray:
    """int32 bias of the size of a few hundred accumulator LSBs per tap; 'large' adds +-2^20-ish
    values; 'small' within +-64; 'zero' gives zeros."""
    if mode == "zero":
        return np.zeros(n, np.int32)
    if mode == "small":
        return rng.integers(-64, 65, size=n).astype(np.int32)
    span = int(127 * 64 * math.sqrt(max(taps, 1)))
    if mode == "large":
        span = 1 << 22
    return rng.integers(-span, span + 1, size=n, dtype=np.int64).astype(np.int32)
