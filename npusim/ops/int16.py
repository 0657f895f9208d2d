"""The 16x8 paths of the elementwise ops ADD, SUB, MUL, LOGISTIC and SOFTMAX: int16 operands
(symmetric, zero point 0), as the PyPI TFLM computes them (reference_integer_ops add.h, mul.h,
logistic.h; sub.cc; reference_ops::SoftmaxInt16). Plain numpy on int64: exactness, not speed, is the
aim; each op's module picks this path at Prepare by its input's type. The MAC ops' 16x8 paths and
the checks every 16x8 op shares are in kernels/int16.py.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import numpy as np

from ..graph import Tensor
from ..kernels.int16 import INT16_MAX, INT16_MIN, mbqm, require_int16
from ..quant import quantize_multiplier, round_half_away, wrap16, wrap32
from .pairwise import LEFT_SHIFT_16


def add16(a, b, params) -> np.ndarray:
    """ADD on int16 operands already broadcast to the output shape; params as Add.params16."""
    m1, s1, m2, s2, mo, so, lo, hi = params
    total = mbqm(a.astype(np.int64) << LEFT_SHIFT_16, m1, s1) + mbqm(
        b.astype(np.int64) << LEFT_SHIFT_16, m2, s2
    )
    return np.clip(mbqm(total, mo, so), lo, hi).astype(np.int16)


def sub16(a, b, params) -> np.ndarray:
    """SUB (TFLM sub.cc, int16 output: left_shift 15) on int16 operands broadcast to the output
    shape; params as add16's. The steps of add16 with the rescaled operands subtracted."""
    m1, s1, m2, s2, mo, so, lo, hi = params
    diff = mbqm(a.astype(np.int64) << LEFT_SHIFT_16, m1, s1) - mbqm(
        b.astype(np.int64) << LEFT_SHIFT_16, m2, s2
    )
    return np.clip(mbqm(diff, mo, so), lo, hi).astype(np.int16)


def mul16(a, b, params) -> np.ndarray:
    """MUL (reference_integer_ops::MulElementwise) on int16 operands broadcast to the output shape:
    the int32 product (at most 2^30) requantized once."""
    m, shift, lo, hi = params
    return np.clip(mbqm(a.astype(np.int64) * b.astype(np.int64), m, shift), lo, hi).astype(np.int16)


# LOGISTIC: TFLM's int16 kernel (reference_integer_ops::Logistic, int16 overload) interpolates
# linearly in a 256-entry table of sigmoid(i / 24) in 0.16 format and saturates beyond its end.
SIGMOID_TABLE_STEPS = 256
SIGMOID_TABLE_STEP = 1.0 / 24.0  # table entries per unit of input: 24
LOGISTIC_OUTPUT_LOG2_SCALE = -15  # the output scale TFLM requires: 2^-15, zero point 0


def scaled_sigmoid(t: np.ndarray) -> np.ndarray:
    return 65536.0 / (1.0 + np.exp(-t))


@functools.cache
def sigmoid_table_uint16() -> np.ndarray:
    """The table as its construction reads: each sample of 65536 * sigmoid(i / 24) moved by half of
    the linear interpolation's error at the middle of its interval (the chord between two samples
    lies under the concave curve, so raising both ends halves the largest error), rounded; the last
    entry is the value the kernel saturates to beyond the table, 1.0 clipped to 65535. The tests hold
    every int16 input code at scales that reach the table's end to TFLM (the last entry is the only
    one they cannot tell from its neighbour value: 65534 and 65535 interpolate to the same outputs)."""
    i = np.arange(SIGMOID_TABLE_STEPS, dtype=np.float64)
    at, mid, after = (scaled_sigmoid((i + d) * SIGMOID_TABLE_STEP) for d in (0.0, 0.5, 1.0))
    table = np.round(at + (mid - (at + after) / 2.0) / 2.0).astype(np.int64)
    table[-1] = 65535
    table.flags.writeable = False
    return table


def checked_log2(x: float) -> tuple[int, bool]:
    """CheckedLog2 (kernels/internal/common.h) in float32: (round(log2 x), |fraction| < 1e-3)."""
    x_log2 = np.float32(np.log(np.float32(x))) * (np.float32(1.0) / np.float32(np.log(np.float32(2.0))))
    rounded = np.float32(np.copysign(np.floor(abs(x_log2) + np.float32(0.5)), x_log2))  # std::round
    return int(rounded), bool(abs(np.float32(x_log2 - rounded)) < np.float32(1e-3))


def logistic16_params(kernel, x: Tensor, y: Tensor) -> tuple[int, int]:
    """(input_multiplier, input_left_shift) as TFLM's LOGISTIC Prepare computes them for int16, the
    eval's power-of-two case (multiplier 0: 3 << shift, shift 0) already resolved."""
    require_int16(kernel, x, y)
    log2_out, out_pot = checked_log2(float(np.float32(y.quant.scale[0])))
    if not out_pot or log2_out != LOGISTIC_OUTPUT_LOG2_SCALE:
        raise kernel.error(
            f"output {y.name!r} has scale {float(y.quant.scale[0]):g}, expected 2^-15 (TFLM int16 logistic)"
        )
    scale = float(np.float32(x.quant.scale[0]))
    log2_in, pot = checked_log2(scale)
    shift = 12 + log2_in  # (15 - kInputIntegerBits) + round(log2 scale), kInputIntegerBits 3
    if pot and shift == 0:
        return 3, 0
    multiplier, shift = scale * 4096.0 * 3.0, 0  # to an input scale of 1 / (3 * 4096)
    while multiplier <= 32767.0 / 2.0 and shift <= 30:
        shift += 1
        multiplier *= 2.0
    return int(multiplier), shift


def logistic16(x: np.ndarray, multiplier: int, shift: int) -> np.ndarray:
    """reference_integer_ops::Logistic on int16: rescale (int32 arithmetic), interpolate in the
    sigmoid table on |x| (9 fraction bits), mirror for negative inputs, back to 16 bits."""
    rounding = (1 << (shift - 1)) if shift > 0 else 0
    d = wrap32(x.astype(np.int64) * multiplier + rounding) >> shift
    a = np.abs(d)  # as uint32: |INT32_MIN| = 2^31
    uh = a >> 9
    idx = np.minimum(uh, 254)
    table = sigmoid_table_uint16()
    ua, ub = table[idx], table[idx + 1]
    result = np.where(uh >= 255, 0x7FFF << 10, (ua << 9) + (a & 0x1FF) * (ub - ua))
    result = np.where(d >= 0, result + (1 << 9), (1 << 25) - result + (1 << 9) - 1) & 0xFFFFFFFF
    return (result >> 10).astype(np.int16)


# SOFTMAX: TFLM's int16 kernel (reference_ops::SoftmaxInt16) looks exp and 1 / (1 + x) up in two
# 513-entry tables that Prepare fills (LUTPopulate<int16_t>, float arithmetic) and interpolates
# between entries (LUTLookup: 9 index bits, 7 fraction bits).
SOFTMAX_OUTPUT_SCALE = 1.0 / 32768
LUT_STEPS = 512


@functools.cache
def _expf():
    """The C library's expf (std::exp on a float), which TFLM's tables are built with."""
    try:
        f = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6").expf
    except (OSError, AttributeError):  # pragma: no cover - no C math library
        return lambda v: np.float32(np.exp(np.float32(v)))
    f.restype, f.argtypes = ctypes.c_float, [ctypes.c_float]
    return lambda v: np.float32(f(float(v)))


def _round_f32(v) -> np.float32:
    """TfLiteRound on a float (half away from zero)."""
    return np.float32(round_half_away(float(v)))


def lut_populate_int16(
    input_scale, input_zero_point, output_scale, output_zero_point, transform
) -> np.ndarray:
    """LUTPopulate<int16_t> (detail::LUTPopulateInt16<float>): 512 samples of transform over the int16
    input range, each biased by half the interpolation error at its midpoint, and the last value."""
    f = np.float32
    input_scale, output_scale = f(input_scale), f(output_scale)
    input_min = input_scale * f(INT16_MIN - input_zero_point)
    input_max = input_scale * f(INT16_MAX - input_zero_point)
    output_min = output_scale * f(INT16_MIN - output_zero_point)
    output_max = output_scale * f(INT16_MAX - output_zero_point)
    step = (input_max - input_min) / f(LUT_STEPS)
    half_step = step / f(2)
    scaling_inv = f(65536) / (output_max - output_min)
    lut = np.empty(LUT_STEPS + 1, dtype=np.int64)
    for i in range(LUT_STEPS):
        val = transform(input_min + f(i) * step)
        val_midpoint = transform(input_min + f(i) * step + half_step)
        val_next = transform(input_min + f(i + 1) * step)
        sample_val = _round_f32(val * scaling_inv)
        midpoint_interp_val = _round_f32((val_next * scaling_inv + _round_f32(val * scaling_inv)) / f(2))
        midpoint_err = midpoint_interp_val - _round_f32(val_midpoint * scaling_inv)
        bias = _round_f32(midpoint_err / f(2))
        lut[i] = int(min(max(sample_val - bias, f(INT16_MIN)), f(INT16_MAX)))
    lut[LUT_STEPS] = int(min(max(_round_f32(transform(input_max) * scaling_inv), f(INT16_MIN)), f(INT16_MAX)))
    return lut


@functools.cache
def softmax16_tables() -> tuple[np.ndarray, np.ndarray]:
    """(exp LUT over [-10, 0], 1 / (1 + x) LUT over [0, 1]), as TFLM's SoftmaxPrepare fills them."""
    span = np.float32(INT16_MAX - INT16_MIN)  # 65535
    one = np.float32(1.0)
    exp_lut = lut_populate_int16(np.float32(10.0) / span, INT16_MAX, np.float32(2.0) / span, 0, _expf())
    recip_lut = lut_populate_int16(
        one / span, INT16_MIN, np.float32(2.0) / span, 0, lambda v: one / (one + v)
    )
    exp_lut.flags.writeable = recip_lut.flags.writeable = False
    return exp_lut, recip_lut


def lut_lookup16(v: np.ndarray, lut: np.ndarray) -> np.ndarray:
    """LUTLookup(int16_t, const int16_t*): v int64 in the int16 range -> int64 in the int16 range."""
    index = 256 + (v >> 7)
    base = lut[index]
    slope = wrap16(lut[index + 1] - base)
    return wrap16(base + ((slope * (v & 0x7F) + 64) >> 7))


def softmax16_params(kernel, x: Tensor, y: Tensor, beta: float) -> tuple[int, int]:
    """(input_multiplier, input_left_shift) of TFLM's int16 SOFTMAX: input differences rescaled so
    that [-65535, 0] stands for [-10, 0]."""
    require_int16(kernel, x, y)
    out_scale = np.float32(y.quant.scale[0])
    if not abs(out_scale - np.float32(SOFTMAX_OUTPUT_SCALE)) <= np.float32(0.001) * np.float32(
        SOFTMAX_OUTPUT_SCALE
    ):
        raise kernel.error(
            f"output {y.name!r} has scale {float(out_scale):g}, expected 1/32768 (TFLM int16 softmax)"
        )
    return quantize_multiplier(float(np.float32(x.quant.scale[0])) * float(beta) / (10.0 / 65535.0))


def softmax16(x: np.ndarray, multiplier: int, shift: int) -> np.ndarray:
    """reference_ops::SoftmaxInt16 over the last axis of int16 x."""
    exp_lut, recip_lut = softmax16_tables()
    v = x.astype(np.int64)
    diff = v - v.max(axis=-1, keepdims=True)
    scaled = np.clip(mbqm(diff, multiplier, shift) + 32767, INT16_MIN, INT16_MAX)
    exps = lut_lookup16(scaled, exp_lut)  # Q0.15
    total = exps.sum(axis=-1, keepdims=True) & 0xFFFFFFFF  # int32 sum, as uint32 for the clz
    headroom_plus_one = 32 - np.frexp(total.astype(np.float64))[1]  # clz (exact: total < 2^53)
    shifted_sum = ((total << (headroom_plus_one - 1)) + (1 << 13)) >> 14
    recip = lut_lookup16(np.clip(shifted_sum - ((1 << 15) + (1 << 16)), INT16_MIN, INT16_MAX), recip_lut)
    right_shift = 31 - headroom_plus_one
    out = (exps * recip + (np.int64(1) << (right_shift - 1))) >> right_shift
    return np.clip(out, 0, INT16_MAX).astype(np.int16)
