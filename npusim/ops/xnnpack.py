"""XNNPACK's arithmetic for the xnnpack profile (quant.XNNPACK): what LiteRT's default CPU
interpreter (OpResolverType.AUTO, the XNNPACK delegate) computes for the ops it delegates, as the
tables the one- and two-input int8 ops evaluate. An op the delegate refuses runs on LiteRT's
builtin kernel, whose arithmetic is TFLM's; the predicates here say which.

The MAC ops need nothing here: their fp32 output stage is in the engines (quant.requantize_one).

- ADD and SUB (XNNPACK qs8-vadd/qs8-vaddc, params from xnn_init_qs8_add_minmax_scalar_params; SUB
  is the same kernel with the second operand's scale negated): with ra = float32(sa / so) and
  rb = +-float32(sb / so), shift = 20 - floor(log2(max(|ra|, |rb|))), multipliers
  ma = lrintf(|ra| * 2^shift) (half to even; the sign put back after), then
      y = clamp(((bias + a * ma + b * mb) >> shift) + zo),  bias = 2^(shift - 1) - ma * za - mb * zb
  an arithmetic shift, so a tie rounds toward +inf. One rounding, 21-bit multipliers: it parts
  from TFLM's three double-rounded 31-bit multiplies on a few pairs (more with power-of-two scales,
  where ties are common). The delegate takes the op only while sa / so and sb / so (float32) lie
  in [2^-10, 2^8) (xnnpack_delegate.cc, CheckTensorsInputOutputScale); outside, LiteRT's builtin
  ADD, which is TFLM's arithmetic.
- MUL (qs8-vmul fp32): (a - za) * (b - zb) in int32, times float32(float32(sa * sb) / so), rounded
  half to even, + zo: the engines' fp32 output stage (quant.requantize_one), so mul.py needs only
  the predicate: the delegate takes MUL while that product ratio lies in [2^-16, 2^8)
  (CheckTensorsInputProductOutputScale); outside, LiteRT's builtin MUL.
- Every AVX2, AVX-512 and SSE4 kernel of qs8-vadd computes exactly the scalar expression above
  (32-bit products, no overflow for int8 inputs), so the result does not depend on the ISA.
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
