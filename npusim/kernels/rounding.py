"""TFLM's fixed-point requantization as compiled scalar functions, which the kernels inline, with
its numpy array forms: the one place where rounding is decided (npusim/quant.py re-exports it with
the prepare-time arithmetic: multipliers, activation ranges).

Semantics follow TFLM (tensorflow/lite/kernels/internal/common.h); the other output stages are the
roundings other real runtimes use (stages.py).
"""

from __future__ import annotations

import numpy as np

from .jit import njit
from .stages import DOUBLE_ROUNDING, SINGLE_ROUNDING

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def wrap32(v):
    """int64 value(s) -> their int32 two's-complement value, as int64: C++'s wrapping int32
    arithmetic (gemmlowp's Add and Sub on int32). Plain arithmetic, so kernels use it compiled
    (wrap32_jit) and numpy code on arrays."""
    return ((v + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


wrap32_jit = njit(inline="always")(wrap32)


@njit(inline="always")
def saturating_rounding_doubling_high_mul(a, b):
    # Written without branches so that kernels' channel loops vectorize; with a and b int32 values
    # the product is one VPMULDQ.
    ab = np.int64(a) * np.int64(b)
    num = ab + (np.int64(1 << 30) if ab >= 0 else np.int64(1 - (1 << 30)))
    # C++ integer division by 2^31 truncates toward zero: bias negative numerators by 2^31 - 1
    # before the arithmetic shift.
    q = (num + ((num >> 63) & np.int64(INT32_MAX))) >> 31
    return np.int64(INT32_MAX) if (a == INT32_MIN and b == INT32_MIN) else q


@njit(inline="always")
def rounding_divide_by_pot(x, exponent):
    mask = (np.int64(1) << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> exponent) + (1 if remainder > threshold else 0)


@njit(inline="always")
def multiply_by_quantized_multiplier(x, m, shift):
    """TFLM double rounding: high-mul then rounding right shift (ties away from zero)."""
    left = shift if shift > 0 else 0
    right = -shift if shift < 0 else 0
    a = np.int64(x) << left
    # TFLM keeps the shifted value in int32; it does not saturate here (callers keep it in range).
    a = np.int64(np.int32(a))
    return rounding_divide_by_pot(saturating_rounding_doubling_high_mul(a, m), right)


@njit(inline="always")
def multiply_by_quantized_multiplier_single(x, m, shift):
    """TFLITE_SINGLE_ROUNDING / CMSIS-NN: one rounding, ties toward +inf."""
    total = 31 - shift
    return (np.int64(x) * np.int64(m) + (np.int64(1) << (total - 1))) >> total


@njit(inline="always")
def requantize_one(acc, m, shift, real_scale, stage):
    """acc requantized by an output stage (stages.py: DOUBLE_ROUNDING, SINGLE_ROUNDING, else FP32)."""
    if stage == DOUBLE_ROUNDING:
        return multiply_by_quantized_multiplier(acc, m, shift)
    if stage == SINGLE_ROUNDING:
        return multiply_by_quantized_multiplier_single(acc, m, shift)
    # XNNPACK fp32 requantization: float32 product, round half to even.
    return np.int64(np.rint(np.float32(acc) * real_scale))


def multiply_by_quantized_multiplier_array(x, m, shift) -> np.ndarray:
    """multiply_by_quantized_multiplier in numpy, elementwise over int64 arrays (x, M and shift
    broadcast), for prepare-time searches over many channels at once (output_stage.
    checked_parameters): the left shift wraps in int32, the nudged product is divided by 2^31
    truncating, then RoundingDivideByPOT. tests/test_output_stage.py holds it to the scalar form."""
    left, right = np.maximum(shift, 0), np.maximum(-shift, 0)
    ab = wrap32(x << left) * m
    num = ab + np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    h = (num + ((num >> 63) & 0x7FFFFFFF)) >> 31
    mask = (np.int64(1) << right) - 1
    return (h >> right) + ((h & mask) > (mask >> 1) + (h < 0))


@njit()
def mbqm_array(x, m, shift):
    """MultiplyByQuantizedMultiplier (TFLM) elementwise over an int64 array, one multiplier."""
    out = np.empty(x.shape, dtype=np.int64)
    xf = x.ravel()
    of = out.ravel()
    for i in range(xf.size):
        of[i] = multiply_by_quantized_multiplier(xf[i], m, shift)
    return out


@njit(inline="always")
def clamp(v, lo, hi):
    return lo if v < lo else (hi if v > hi else v)


@njit(inline="always")
def requantize_to_output(acc, m, shift, real_scale, stage, zero_point, lo, hi):
    """An accumulator to its int8 output: requantize, add the output zero point, clamp to the
    fused activation's range (the output stage of every MAC op)."""
    return clamp(requantize_one(acc, m, shift, real_scale, stage) + zero_point, lo, hi)
