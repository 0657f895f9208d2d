"""The all-pairs tables of the binary elementwise ops that compute one in a loop: SUB's (TFLM's
arithmetic), MUL's and PRELU's (each output stage's, rounding.requantize_one). The operators
(ops/sub.py, ops/mul.py, ops/prelu.py) prepare the parameters and look the table up
(ops/pairwise.py); ADD's vector form is in elementwise.py."""

from __future__ import annotations

import numpy as np

from .jit import njit
from .rounding import (
    clamp,
    multiply_by_quantized_multiplier,
    multiply_by_quantized_multiplier_single,
    requantize_one,
    requantize_to_output,
)
from .stages import SINGLE_ROUNDING

# The input shift of the 8-bit rescales (TFLM's left_shift = 20 in add.cc and sub.cc).
LEFT_SHIFT = 20


@njit(inline="always")
def _rescale(x, m, shift, stage):
    if stage == SINGLE_ROUNDING:
        return multiply_by_quantized_multiplier_single(x, m, shift)
    return multiply_by_quantized_multiplier(x, m, shift)


@njit()
def sub_table(a, b, params, profile):
    """All pairs, TFLM's arithmetic (the xnnpack profile's too where the delegate refuses the op)."""
    z1, z2, m1, s1, m2, s2, mo, so, zo, lo, hi = params
    out = np.empty(a.size, dtype=np.int8)
    for i in range(a.size):
        x1 = _rescale((a[i] - z1) << LEFT_SHIFT, m1, s1, profile)
        x2 = _rescale((b[i] - z2) << LEFT_SHIFT, m2, s2, profile)
        out[i] = clamp(_rescale(x1 - x2, mo, so, profile) + zo, lo, hi)
    return out


@njit()
def mul_table(a, b, z1, z2, m, shift, real_scale, profile, zo, lo, hi):
    out = np.empty(a.size, dtype=np.int8)
    for i in range(a.size):
        # |product| <= 255 * 255: int32, as in TFLM.
        out[i] = requantize_to_output((a[i] - z1) * (b[i] - z2), m, shift, real_scale, profile, zo, lo, hi)
    return out


@njit()
def prelu_table(x, a, zx, za, zy, m1, s1, r1, m2, s2, r2, profile):
    out = np.empty(x.size, dtype=np.int8)
    for i in range(x.size):
        v = x[i] - zx
        if v >= 0:
            o = requantize_one(v, m1, s1, r1, profile)
        else:
            o = requantize_one(v * (a[i] - za), m2, s2, r2, profile)
        o += zy
        out[i] = max(-128, min(127, o))
    return out
