"""XNNPACK's arithmetic for the xnnpack profile (quant.XNNPACK): what LiteRT's default CPU
interpreter (OpResolverType.AUTO, the XNNPACK delegate) computes for the ops it delegates, as the
tables the one- and two-input int8 ops evaluate. An op the delegate refuses runs on LiteRT's
builtin kernel; the predicates here say which (limits probed against LiteRT 2.3.0, docs/numerics.md).

The MAC ops need nothing here: their fp32 output stage is in the engines (quant.requantize_one).

- ADD and SUB (XNNPACK qs8-vadd/qs8-vaddc, params from xnn_init_qs8_add_minmax_scalar_params; SUB
  is the same kernel with the second operand's scale negated): with ra = float32(sa / so) and
  rb = +-float32(sb / so), shift = 20 - floor(log2(max(|ra|, |rb|))), multipliers
  ma = lrintf(|ra| * 2^shift) (half to even; the sign put back after), then
      y = clamp(((bias + a * ma + b * mb) >> shift) + zo),  bias = 2^(shift - 1) - ma * za - mb * zb
  an arithmetic shift, so a tie rounds toward +inf. One rounding, 21-bit multipliers: it parts
  from TFLM's three double-rounded 31-bit multiplies on a few pairs (more with power-of-two scales,
  where ties are common). The delegate takes the op only while sa / so and sb / so (float32) lie
  in [2^-10, 2^8); outside, LiteRT's builtin ADD, taken as TFLM's arithmetic (equal below 2^-10 in
  the cases tested; from 2^8 on it wraps where TFLM saturates, not modelled).
- MUL (qs8-vmul fp32): (a - za) * (b - zb) in int32, times float32(float32(sa * sb) / so), rounded
  half to even, + zo: the engines' fp32 output stage (quant.requantize_one), so mul.py needs only
  the predicate: the delegate takes MUL while that product ratio lies in [2^-16, 2^8); outside,
  LiteRT's builtin MUL, taken as TFLM's (not so from 2^8 on: not modelled).
- XNNPACK's kernel tests require every x86 variant of these kernels to equal its scalar reference,
  the expressions here; the AVX2 qs8-vadd is that expression in 32-bit lanes, which int8 inputs
  cannot overflow. This machine runs the AVX2 kernels only.
"""

from __future__ import annotations

import numpy as np

from ..engines.requant import output_range
from ..quant import XNNPACK
from .pairwise import every_pair

# The scale ratio range the delegate accepts for ADD and SUB (each input against the output).
ADD_RATIO_MIN, ADD_RATIO_MAX = 2.0**-10, 2.0**8


def add_ratios(a, b, y, subtract: bool) -> tuple[np.float32, np.float32]:
    """(sa / so, +-sb / so) in float32, as XNNPACK's params init divides them."""
    so = np.float32(y.quant.scale[0])
    ra = np.float32(a.quant.scale[0]) / so
    rb = np.float32(b.quant.scale[0]) / so
    return ra, (-rb if subtract else rb)


def delegates_add(a, b, y) -> bool:
    """Whether LiteRT's XNNPACK delegate takes an int8 ADD or SUB of these operands."""
    ratios = add_ratios(a, b, y, False)
    return all(ADD_RATIO_MIN <= float(r) < ADD_RATIO_MAX for r in ratios)


# The product scale ratio range the delegate accepts for MUL.
MUL_RATIO_MIN, MUL_RATIO_MAX = 2.0**-16, 2.0**8


def delegates_mul(product_ratio: np.float32) -> bool:
    """Whether the delegate takes an int8 MUL whose float32(float32(sa * sb) / so) is this."""
    return MUL_RATIO_MIN <= float(product_ratio) < MUL_RATIO_MAX


def add_table(a, b, y, subtract: bool, activation: str) -> np.ndarray:
    """The int8 [65536] table (pairwise.every_pair order) of XNNPACK's ADD (SUB: subtract True),
    clamped to the fused activation's range as XNNPACK quantizes it."""
    lo, hi = output_range(activation, y, XNNPACK)
    ra, rb = add_ratios(a, b, y, subtract)
    largest = max(abs(float(ra)), abs(float(rb)))
    shift = 20 - (np.frexp(largest)[1] - 1)  # 20 - the float32 exponent of the larger ratio
    # |r| * 2^shift is exact in float32 (an exponent change) and rint is lrintf's half to even.
    ma, mb = (int(np.copysign(np.rint(np.ldexp(abs(float(r)), shift)), r)) for r in (ra, rb))
    bias = (1 << (shift - 1)) - ma * a.zero_point - mb * b.zero_point
    xa, xb = every_pair()
    # |bias + a * ma + b * mb| < 2^31 for int8 codes and |m| <= 2^21: XNNPACK's int32 never wraps.
    acc = bias + xa * ma + xb * mb
    return np.clip((acc >> shift) + y.zero_point, lo, hi).astype(np.int8)


# ----------------------------------------------------------------------------------------------
# QUANTIZE
# ----------------------------------------------------------------------------------------------
# float32 -> int8 (f32-qs8-vcvt; always delegated): x * float32(1 / so) in float32, min'ed with
# 127 - zo in float (a NaN becomes 127 - zo: MINPS returns its second operand), rounded half to
# even (CVTPS2DQ; beyond int32 it gives INT32_MIN), + zo and saturated. TFLM divides instead and
# rounds half away from zero.
# int8 -> int8 (qs8-vcvt), delegated while 2^-8 <= float32(si / so) <= 2^7: M = lrintf(256 *
# float32(si / so)), y = ((x - zi) * M + 128) >> 8 (round half up) + zo, saturated. The AVX2
# kernel's MULHRS of ((zi - x) << 7) by -M rounds the same way.
# Outside the delegate (uint8 inputs, int8 ratios out of range): LiteRT's builtin QUANTIZE, whose
# optimized Requantize runs NEON code (NEON_2_SSE on x86) on each run of 16 elements: VQRDMULH
# (rounding half up) then VRSHL (half up), where TFLM's MultiplyByQuantizedMultiplier rounds both
# steps half away from zero; the last size % 16 elements of a tensor take TFLM's scalar loop.
REQUANT_RATIO_MIN, REQUANT_RATIO_MAX = 2.0**-8, 2.0**7


def quantize_f32(x: np.ndarray, scale, zero_point: int) -> np.ndarray:
    """f32-qs8-vcvt: float32 x to int8 codes."""
    inv = np.float32(1.0) / np.float32(scale)
    with np.errstate(over="ignore", invalid="ignore"):
        v = np.asarray(x, dtype=np.float32) * inv
        v = np.where(np.isnan(v), np.float32(127 - zero_point), np.minimum(v, np.float32(127 - zero_point)))
        r = np.rint(v.astype(np.float64))
    r = np.where(r < -(2.0**31), -(2.0**31), r)  # CVTPS2DQ's "integer indefinite" is INT32_MIN
    return np.clip(r.astype(np.int64) + zero_point, -128, 127).astype(np.int8)


def delegates_requantize(x, y) -> bool:
    """Whether the delegate takes an 8-bit -> int8 QUANTIZE (int8 input, ratio in range)."""
    ratio = float(np.float32(x.quant.scale[0]) / np.float32(y.quant.scale[0]))
    return x.dtype == np.int8 and REQUANT_RATIO_MIN <= ratio <= REQUANT_RATIO_MAX


def requantize_codes(centred: np.ndarray, x, y) -> np.ndarray:
    """qs8-vcvt on the centred input codes (x - zi), int64 -> int8 output codes."""
    m = int(np.rint(np.float32(256.0) * (np.float32(x.quant.scale[0]) / np.float32(y.quant.scale[0]))))
    return np.clip(((centred * m + 128) >> 8) + y.zero_point, -128, 127).astype(np.int8)


def neon_multiply(x: np.ndarray, m: int, shift: int) -> np.ndarray:
    """TFLite's MultiplyByQuantizedMultiplier4Rows (NEON): VQRDMULH(x << left, M) rounds half up,
    then VRSHL by -right rounds half up (int64 in, int64 out; |x| < 2^31 after the left shift)."""
    left, right = max(shift, 0), max(-shift, 0)
    high = ((x << left) * m * 2 + (1 << 31)) >> 32
    return (high + ((1 << right) >> 1)) >> right if right else high
