"""SOFTMAX, int8 in -> int8 out (scale 1/256, zero point -128), over the last axis.

Prepare follows TFLM micro/kernels/softmax_common.cc (CalculateSoftmaxParams); Eval follows
reference_ops::Softmax<int8_t, int8_t> (kernels/internal/reference/softmax.h) with gemmlowp's
fixed-point exp_on_negative_values and one_over_one_plus_x_for_x_in_0_1 (fixedpoint/fixedpoint.h).

Everything after the row maximum is a pure function of d = max - x in [0, 255], so prepare tabulates
exp(-d) once (in Q0.31 and in the Q12.19 accumulation format); eval only sums table entries, takes
the reciprocal and rescales. This is bit-identical to evaluating exp per element as TFLM does.

The xnnpack profile runs LiteRT's builtin int8 softmax instead, a float lookup table
(xnnpack.softmax): XNNPACK takes no int8 SOFTMAX.

int16 in and out (output scale 1/32768, zero point 0, tflm profile) takes TFLM's int16 path: exp and
1 / (1 + x) from interpolated lookup tables built as TFLM's Prepare builds them (int16.softmax16).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np
from numba.cpython.unsafe.numbers import leading_zeros

from ..kernels.int16 import is_int16, require_tflm
from ..kernels.jit import njit, parallel_kernel
from ..profiles import profile_of, xnnpack
from ..quant import (
    INT32_MAX,
    INT32_MIN,
    quantize_multiplier,
    rounding_divide_by_pot,
    saturating_rounding_doubling_high_mul,
    wrap32_jit,
)
from .base import Kernel
from .float_form import FloatForm, real
from .int16 import softmax16, softmax16_params

# Q5.26 input to exp (TFLM's kScaledDiffIntegerBits), Q12.19 sum (kAccumulationIntegerBits).
SCALED_DIFF_INTEGER_BITS = 5
ACCUMULATION_INTEGER_BITS = 12


@njit(inline="always")
def _wrap32(x):
    """gemmlowp's Add/Sub on int32 are plain (wrapping) integer arithmetic."""
    return wrap32_jit(np.int64(x))


@njit(inline="always")
def _fx_mul(a, b):
    """FixedPoint operator*: SaturatingRoundingDoublingHighMul on the raw int32 values."""
    return np.int64(saturating_rounding_doubling_high_mul(np.int64(a), np.int64(b)))


@njit(inline="always")
def _saturating_shift_left(x, exponent):
    """gemmlowp SaturatingRoundingMultiplyByPOT<exponent > 0> on int32."""
    threshold = (np.int64(1) << (31 - exponent)) - 1
    if x > threshold:
        return np.int64(INT32_MAX)
    if x < -threshold:
        return np.int64(INT32_MIN)
    return x << exponent


@njit()
def _exp_on_interval_between_negative_one_quarter_and_0_excl(a):
    """exp(a) for a in [-1/4, 0), Q0.31 in and out: Taylor expansion around -1/8."""
    constant_term = np.int64(1895147668)  # exp(-1/8)
    constant_1_over_3 = np.int64(715827883)
    x = _wrap32(a + (np.int64(1) << 28))  # a + 1/8
    x2 = _fx_mul(x, x)
    x3 = _fx_mul(x2, x)
    x4 = _fx_mul(x2, x2)
    x4_over_4 = rounding_divide_by_pot(x4, 2)
    inner = _wrap32(_fx_mul(_wrap32(x4_over_4 + x3), constant_1_over_3) + x2)
    x4_over_24_plus_x3_over_6_plus_x2_over_2 = rounding_divide_by_pot(inner, 1)
    return _wrap32(
        constant_term + _fx_mul(constant_term, _wrap32(x + x4_over_24_plus_x3_over_6_plus_x2_over_2))
    )


@njit()
def exp_on_negative_values(a, integer_bits):
    """gemmlowp exp_on_negative_values for FixedPoint<int32, integer_bits> input (a <= 0);
    returns Q0.31 raw. Softmax uses Q5.26 input, LOGISTIC Q4.27."""
    fractional_bits = 31 - integer_bits
    one_quarter = np.int64(1) << (fractional_bits - 2)
    mask = one_quarter - 1
    a_mod_quarter_minus_one_quarter = _wrap32((a & mask) - one_quarter)
    # Rescale<0> from Q(integer_bits) to Q0.31: saturating left shift by integer_bits.
    result = _exp_on_interval_between_negative_one_quarter_and_0_excl(
        _saturating_shift_left(a_mod_quarter_minus_one_quarter, integer_bits)
    )
    remainder = _wrap32(a_mod_quarter_minus_one_quarter - a)
    # Barrel shifter: exp(-2^k) for k = -2 .. 4, those below kIntegerBits.
    multipliers = (1672461947, 1302514674, 790015084, 290630308, 39332535, 720401, 242)
    for i in range(7):
        exponent = i - 2
        if integer_bits > exponent:
            shift_amount = fractional_bits + exponent
            if remainder & (np.int64(1) << shift_amount):
                result = _fx_mul(result, np.int64(multipliers[i]))
    if integer_bits > 5 and a < -(np.int64(1) << (36 - integer_bits)):  # below -32: zero
        result = np.int64(0)
    if a == 0:
        result = np.int64(INT32_MAX)  # FixedPoint<int32, 0>::One()
    return result


@njit()
def exp_on_negative_values_q5_26(a):
    """gemmlowp exp_on_negative_values for FixedPoint<int32, 5> input; returns Q0.31 raw."""
    return exp_on_negative_values(a, SCALED_DIFF_INTEGER_BITS)


@njit()
def reciprocal_of_half_sum(a):
    """gemmlowp's Newton-Raphson 1 / ((1 + x) / 2) for x in [0, 1]: Q0.31 raw in, Q2.29 raw out.
    The shared core of one_over_one_plus_x_for_x_in_0_1 and one_minus_x_over_one_plus_x_for_x_in_0_1,
    which differ only in how they rescale it."""
    s = np.int64(a) + np.int64(INT32_MAX)  # RoundingHalfSum(a, One())
    half_denominator = (s + 1) // 2 if s >= 0 else -((-(s - 1)) // 2)
    constant_48_over_17 = np.int64(1515870810)  # Q2.29
    constant_neg_32_over_17 = np.int64(-1010580540)
    one_q2 = np.int64(1) << 29
    x = _wrap32(constant_48_over_17 + _fx_mul(half_denominator, constant_neg_32_over_17))
    for _ in range(3):
        half_denominator_times_x = _fx_mul(half_denominator, x)
        one_minus_half_denominator_times_x = _wrap32(one_q2 - half_denominator_times_x)
        x = _wrap32(x + _saturating_shift_left(_fx_mul(x, one_minus_half_denominator_times_x), 2))
    return x


@njit()
def one_over_one_plus_x_for_x_in_0_1(a):
    """gemmlowp Newton-Raphson 1/(1+x) for x in [0, 1), Q0.31 raw in and out."""
    return _saturating_shift_left(reciprocal_of_half_sum(a), 1)  # Rescale<0>(ExactMulByPot<-1>(x))


@njit()
def build_exp_tables(input_multiplier, input_left_shift, diff_min):
    """exp(beta * s * -d) for d = max - x in [0, 255]: (Q0.31, Q12.19) per d, 0 where d is beyond
    diff_min. TFLM skips those elements (no term in the sum, output -128); a zero entry does the
    same, as a term of 0 adds nothing and scale x 0 rounds to 0, an output of -128."""
    exp_q0 = np.zeros(256, dtype=np.int64)
    exp_q12 = np.zeros(256, dtype=np.int64)
    for d in range(256):
        input_diff = -d
        if input_diff < diff_min:
            continue
        # MultiplyByQuantizedMultiplierGreaterThanOne: x * 2^left_shift stays in int32 because
        # diff_min was chosen (CalculateInputRadius) so that it cannot overflow.
        rescaled = saturating_rounding_doubling_high_mul(
            _wrap32(np.int64(input_diff) << input_left_shift), np.int64(input_multiplier)
        )
        e = exp_on_negative_values_q5_26(np.int64(rescaled))
        exp_q0[d] = e
        exp_q12[d] = rounding_divide_by_pot(e, ACCUMULATION_INTEGER_BITS)  # Rescale<12>
    return exp_q0, exp_q12


@parallel_kernel
def softmax_rows(x, exp_q0, exp_q12, out, bad):
    """x, out: [rows, depth] int8. reference_ops::Softmax, int8 output (zero point -128). The loops
    over a row have no branch (the tables are 0 where TFLM skips an element), so they vectorize.

    bad[r] is set where TFLM's TFLITE_CHECK(0 <= exponent <= 31) aborts: exponent = 35 - clz(sum),
    so any row whose sum of exponentials reaches 512.0 (e.g. more than 512 equal maxima) aborts TFLM.
    """
    rows, depth = x.shape
    for r in nb.prange(rows):
        max_in_row = np.int64(-128)
        for c in range(depth):
            max_in_row = max(max_in_row, np.int64(x[r, c]))
        sum_of_exps = np.int64(0)  # Q12.19, each term at most 2^19; wraps as in C++ past 4096 terms
        for c in range(depth):
            sum_of_exps = _wrap32(sum_of_exps + exp_q12[max_in_row - x[r, c]])
        # GetReciprocal(sum, kAccumulationIntegerBits): normalise to [1, 2), Newton-Raphson 1/(1+x).
        u = np.uint32(sum_of_exps & 0xFFFFFFFF)
        headroom_plus_one = np.int64(leading_zeros(u))  # CountLeadingZeros (32 for 0)
        num_bits_over_unit = ACCUMULATION_INTEGER_BITS - headroom_plus_one
        shifted_sum_minus_one = _wrap32((np.int64(u) << headroom_plus_one) - (np.int64(1) << 31))
        shifted_scale = one_over_one_plus_x_for_x_in_0_1(shifted_sum_minus_one)
        exponent = num_bits_over_unit + 31 - 8
        if exponent < 0 or exponent > 31:
            bad[r] = True
            continue
        for c in range(depth):
            unsat = rounding_divide_by_pot(_fx_mul(shifted_scale, exp_q0[max_in_row - x[r, c]]), exponent)
            out[r, c] = min(max(unsat - 128, -128), 127)
    return out


def preprocess_softmax_scaling(beta: float, input_scale: float, input_integer_bits: int) -> tuple[int, int]:
    """PreprocessSoftmaxScaling (quantization_util.cc, double-rounding build)."""
    real = min(float(beta) * float(input_scale) * float(1 << (31 - input_integer_bits)), float((1 << 31) - 1))
    return quantize_multiplier(real)


def calculate_input_radius(
    input_integer_bits: int, input_left_shift: int, total_signed_bits: int = 31
) -> int:
    """CalculateInputRadius: the largest |x - max| whose rescaled value still fits in int32."""
    max_input_rescaled = (
        1.0
        * ((1 << input_integer_bits) - 1)
        * float(1 << (total_signed_bits - input_integer_bits))
        / float(1 << input_left_shift)
    )
    return int(math.floor(max_input_rescaled))


class SoftmaxFloat(FloatForm):
    """exp(beta * (x - max)) / sum over the last axis (LiteRT reference_ops Softmax), in float64."""

    def __init__(self, op, graph):
        super().__init__(op, graph)
        self.beta = float(np.float32(op.options.get("beta", 1.0)))

    def __call__(self, x):
        x = real(x)
        z = x.astype(np.float64)
        e = np.exp(self.beta * (z - z.max(axis=-1, keepdims=True)))
        return (e / e.sum(axis=-1, keepdims=True)).astype(x.dtype)


class Softmax(Kernel):
    kind = "SOFTMAX"
    float_form = SoftmaxFloat

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        inp, out = self.inputs[0], self.outputs[0]
        self.params16 = self.lut = None
        if is_int16(inp):
            require_tflm(self)
        else:
            self.require_int8(inp, out)
        if len(inp.shape) < 1:
            raise self.error(f"input {inp.name!r} is a scalar, expected at least one dimension")
        if tuple(out.shape) != tuple(inp.shape):
            raise self.error(
                f"output {out.name!r} has shape {list(out.shape)}, expected the input's {list(inp.shape)}"
            )
        self.depth = int(inp.shape[-1])
        if is_int16(inp):  # int16 in and out (int16.softmax16)
            beta = float(np.float32(op.options.get("beta", 1.0)))
            self.params16 = softmax16_params(self, inp, out, beta)
            return
        # TFLM: TF_LITE_ENSURE_EQ(zero_point, -128) and TF_LITE_ENSURE(scale == 1.f / 256), exact float32.
        if out.zero_point != -128 or np.float32(out.scale) != np.float32(1.0 / 256):
            raise self.error(
                f"output {out.name!r} has scale {out.scale:g} and zero point {out.zero_point}, "
                "expected scale 1/256 and zero point -128 (TFLM int8 softmax)"
            )
        beta = float(np.float32(op.options.get("beta", 1.0)))  # TfLiteSoftmaxParams.beta is a float
        # not delegated: LiteRT's builtin float-table softmax (xnnpack.softmax)
        if profile_of(profile).xnnpack_delegate:
            self.lut = xnnpack.softmax_table(inp.scale, beta)
            return
        input_scale = float(np.float32(inp.scale))
        real = beta * input_scale * float(1 << (31 - SCALED_DIFF_INTEGER_BITS))
        if not real > 1.0:
            # QuantizeMultiplierGreaterThanOne CHECK-fails in TFLM for these.
            raise self.error(
                f"beta {beta:g} * input scale {input_scale:g} is too small (beta*scale*2^26 must exceed 1)"
            )
        self.input_multiplier, self.input_left_shift = preprocess_softmax_scaling(
            beta, input_scale, SCALED_DIFF_INTEGER_BITS
        )
        self.diff_min = -calculate_input_radius(SCALED_DIFF_INTEGER_BITS, self.input_left_shift)
        self.exp_q0, self.exp_q12 = build_exp_tables(
            np.int64(self.input_multiplier), np.int64(self.input_left_shift), np.int64(self.diff_min)
        )
        self.depth = int(inp.shape[-1])

    def macs(self) -> int:
        return (
            int(np.prod(self.inputs[0].shape[1:], dtype=np.int64))
            if len(self.inputs[0].shape) > 1
            else self.depth
        )

    def __call__(self, x):
        x = np.asarray(x)
        if self.params16 is not None:
            if x.ndim < 1 or x.shape[-1] != self.depth:
                raise self.error(
                    f"input array has shape {list(x.shape)}, expected last dimension {self.depth}"
                )
            return softmax16(x, *self.params16)
        if x.dtype != np.int8:
            raise self.error(f"input array has type {x.dtype}, expected int8")
        if x.ndim < 1 or x.shape[-1] != self.depth:
            raise self.error(f"input array has shape {list(x.shape)}, expected last dimension {self.depth}")
        rows = np.ascontiguousarray(x.reshape(-1, self.depth))
        if self.lut is not None:
            return xnnpack.softmax(rows, self.lut, self.outputs[0].scale, -128).reshape(x.shape)
        out = np.empty(rows.shape, dtype=np.int8)
        bad = np.zeros(rows.shape[0], dtype=np.bool_)
        softmax_rows(rows, self.exp_q0, self.exp_q12, out, bad)
        if bad.any():
            raise self.error(
                f"sum of exponentials reached 512 ({int(bad.sum())} of {bad.size} rows, {self.depth} "
                "classes): TFLM aborts on such input (TFLITE_CHECK "
                "on the output exponent in reference softmax)"
            )
        return out.reshape(x.shape)
