"""gemmlowp's fixed-point arithmetic (fixedpoint/fixedpoint.h) as TFLM's int8 LOGISTIC, TANH and
SOFTMAX run it, compiled: exp_on_negative_values, the Newton-Raphson reciprocals, logistic and tanh
on Q4.27, the loop that tabulates LOGISTIC and TANH on every input byte (q4_activation_table), and
SOFTMAX's exp tables and rows. The operators (npusim/ops/logistic.py, activations.py, softmax.py)
prepare the multipliers and call these.
"""

from __future__ import annotations

import functools

import numba as nb
import numpy as np
from numba.cpython.unsafe.numbers import leading_zeros

from .jit import njit, parallel_kernel, renamed
from .rounding import (
    INT32_MAX,
    INT32_MIN,
    multiply_by_quantized_multiplier,
    rounding_divide_by_pot,
    saturating_rounding_doubling_high_mul,
    wrap32_jit,
)

# Q5.26 input to SOFTMAX's exp (TFLM's kScaledDiffIntegerBits), Q12.19 sum (kAccumulationIntegerBits).
SCALED_DIFF_INTEGER_BITS = 5
ACCUMULATION_INTEGER_BITS = 12
Q4_INTEGER_BITS = 4  # Q4.27 input to the fixed-point logistic and tanh


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


@njit()
def one_minus_x_over_one_plus_x_for_x_in_0_1(a):
    """gemmlowp's (1 - x) / (1 + x) for x in [0, 1], Q0.31 raw in and out: 2 / (1 + x) - 1."""
    one_q2 = np.int64(1) << 29
    return _saturating_shift_left(_wrap32(reciprocal_of_half_sum(a) - one_q2), 2)  # Rescale<0>(x - F2::One())


@njit()
def fixed_point_tanh_q4(a):
    """gemmlowp::tanh for FixedPoint<int32, 4> raw a; returns Q0.31 raw."""
    if a == 0:
        return np.int64(0)
    n = a if a < 0 else -a
    # neg_tanh_on_negative_values: exp of ExactMulByPot<1>(n), a Q5.26 value with n's raw bits.
    t = one_minus_x_over_one_plus_x_for_x_in_0_1(exp_on_negative_values(n, Q4_INTEGER_BITS + 1))
    return -t if a < 0 else t


@njit()
def fixed_point_logistic_q4(a):
    """gemmlowp::logistic for FixedPoint<int32, 4> raw a; returns Q0.31 raw."""
    if a == 0:
        return np.int64(1 << 30)  # one half
    abs_a = a if a > 0 else -a
    result_if_positive = one_over_one_plus_x_for_x_in_0_1(exp_on_negative_values(-abs_a, Q4_INTEGER_BITS))
    if a > 0:
        return result_if_positive
    return np.int64(INT32_MAX) - result_if_positive  # ResultF::One() - result_if_positive


def q4_activation_table(zero_point, radius, multiplier, left_shift, function, output_shift, output_offset):
    """TFLM's int8 LOGISTIC or TANH on every input byte (index: the byte as uint8): -128 / 127 at or
    beyond the input radius from the zero point, else the input rescaled to Q4.27, gemmlowp's
    fixed-point function (Q0.31 out) and a rounding shift to the output. Runs once, at prepare, as
    one compiled loop per function (256 calls from Python into the compiled helpers took 1.26 ms a
    table, 73 ms of preparing YOLOv8n-256 with its 58 LOGISTICs; 0.02 ms now)."""
    table = np.empty(256, dtype=np.int8)
    loop = _table_loop(function)
    return loop(zero_point, radius, multiplier, left_shift, output_shift, output_offset, table)


@functools.cache
def _table_loop(function):
    """_activation_table compiled with FUNCTION bound to the fixed-point function (an njit one)."""
    return njit(renamed(_activation_table, function.py_func.__name__, FUNCTION=function))


def _activation_table(zero_point, radius, multiplier, left_shift, output_shift, output_offset, table):
    """The template of q4_activation_table's loop, where the name FUNCTION stands for its function."""
    for code in range(256):
        x = np.int64(code - 256 if code >= 128 else code) - zero_point
        if x <= -radius:
            table[code] = -128
        elif x >= radius:
            table[code] = 127
        else:
            out_q0 = FUNCTION(np.int64(multiply_by_quantized_multiplier(x, multiplier, left_shift)))  # noqa: F821
            table[code] = max(-128, min(127, rounding_divide_by_pot(out_q0, output_shift) + output_offset))
    return table
