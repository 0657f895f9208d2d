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
- MEAN and SUM (XNNPACK's reduce operator, qs8 rsum / rdsum): the raw int8 codes are summed in
  int32 and the sum converted to float32; y = rint(float(sum) * scale + bias), clamped, with
  scale = float32(s_in / s_out) (times float32(1 / n) for MEAN) and
  bias = float32(zp_out) - float32(n * zp_in) * scale, every step in float32 without a fused
  multiply-add (an FMA would break ties differently: AVX-512 or ARM builds may differ).
- LEAKY_RELU (qs8-vlrelu): 8-bit fixed point, M+ = lrintf(256 * float32(s_in / s_out)),
  M- = lrintf(256 * float32(M+'s real * alpha)); y = ((zp_out << 8) + 128 + (x - zp_in) * M) >> 8,
  clamped. XNNPACK refuses (and LiteRT runs its builtin kernel, TFLM's arithmetic) unless both
  real multipliers lie in XNNPACK's range (leaky_relu_delegated).
- TANH and LOGISTIC (the qs8 lookup-table operators): every code dequantized in float32,
  the float function applied, y = rint(f * float32(1 / s_out) + zp_out) in float32, clamped.
- RESIZE_BILINEAR (qs8-ibilinear with the q11 indirection of XNNPACK's resize-bilinear operator):
  source coordinates in float32, fractional parts as 11-bit weights lrintf(alpha * 2048), an
  exact integer blend of the four taps rounded by (acc + 2^21) >> 22.
- SOFTMAX, which XNNPACK does not take in int8: LiteRT's builtin float-table softmax (below).
- XNNPACK's kernel tests require every x86 variant of the ADD, SUB, MUL and QUANTIZE kernels to
  equal its scalar reference, the expressions here; the AVX2 qs8-vadd is that expression in 32-bit
  lanes, which int8 inputs cannot overflow. This machine runs the AVX2 kernels only.
"""

from __future__ import annotations

import numpy as np

from ..kernels.requant import output_range
from ..ops.pairwise import every_pair
from ..quant import XNNPACK

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
    """Whether the delegate takes an 8-bit QUANTIZE: an int8 input, or uint8 -> uint8 (a legacy uint8
    model's requantize, qu8-vcvt: the shifted codes' qs8-vcvt), with the ratio in range."""
    ratio = float(np.float32(x.quant.scale[0]) / np.float32(y.quant.scale[0]))
    takes = x.dtype == np.int8 or x.dtype == y.dtype == np.uint8
    return takes and REQUANT_RATIO_MIN <= ratio <= REQUANT_RATIO_MAX


def requantize_codes(centred: np.ndarray, x, y, y_zp: int) -> np.ndarray:
    """qs8-vcvt on the centred input codes (x - zi), int64 -> int8 output codes at zero point y_zp
    (the graph's int8 one: a uint8 output's less 128)."""
    m = int(np.rint(np.float32(256.0) * (np.float32(x.quant.scale[0]) / np.float32(y.quant.scale[0]))))
    return np.clip(((centred * m + 128) >> 8) + y_zp, -128, 127).astype(np.int8)


def neon_multiply(x: np.ndarray, m: int, shift: int) -> np.ndarray:
    """TFLite's MultiplyByQuantizedMultiplier4Rows (NEON): VQRDMULH(x << left, M) rounds half up,
    then VRSHL by -right rounds half up (int64 in, int64 out; |x| < 2^31 after the left shift)."""
    left, right = max(shift, 0), max(-shift, 0)
    high = ((x << left) * m * 2 + (1 << 31)) >> 32
    return (high + ((1 << right) >> 1)) >> right if right else high


# ----------------------------------------------------------------------------------------------
# MEAN, SUM, LEAKY_RELU, TANH, LOGISTIC, RESIZE_BILINEAR, SOFTMAX
# ----------------------------------------------------------------------------------------------
_F32 = np.float32
EVERY_CODE = np.arange(256, dtype=np.uint8).view(np.int8).astype(np.int64)  # index: the byte as uint8


def reduce_output(sums: np.ndarray, count: int, s_in, zp_in, s_out, zp_out, mean: bool) -> np.ndarray:
    """XNNPACK's qs8 MEAN (mean True) or SUM of `count` codes per output from their exact sums
    (int64, any shape): int8 of the same shape."""
    scale = _F32(_F32(s_in) / _F32(s_out))
    if mean:
        scale = _F32(scale * (_F32(1.0) / _F32(count)))
    bias = _F32(_F32(zp_out) - _F32(_F32(count * zp_in) * scale))
    # the int32 accumulator's float32 value: exact below 2^24, as XNNPACK's conversion rounds beyond
    acc = np.asarray(sums, dtype=np.int64).astype(np.int32).astype(np.float32)
    return np.clip(np.rint(acc * scale + bias), -128, 127).astype(np.int8)


def leaky_relu_scales(s_in, s_out, alpha) -> tuple:
    """The real multipliers of XNNPACK's qs8 LEAKY_RELU: float32(s_in / s_out) and that times alpha."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        positive = _F32(_F32(s_in) / _F32(s_out))
        negative = _F32(positive * _F32(alpha))
    return positive, negative


def leaky_relu_delegated(s_in, s_out, alpha) -> bool:
    """Whether XNNPACK takes the qs8 LEAKY_RELU (xnn_init_qs8_lrelu's bounds: the positive multiplier
    in [2^-8, 2^7], the negative one's magnitude at least 2^-8, and within [-0x1.FFFCp6, 2^7])."""
    positive, negative = leaky_relu_scales(s_in, s_out, alpha)
    return bool(
        2.0**-8 <= positive <= 2.0**7 and abs(negative) >= 2.0**-8 and -127.9921875 <= negative <= 2.0**7
    )


def leaky_relu_table(s_in, zp_in, s_out, zp_out, alpha) -> np.ndarray:
    """XNNPACK's qs8 LEAKY_RELU on every code (index: the byte as uint8)."""
    positive, negative = leaky_relu_scales(s_in, s_out, alpha)
    m_pos = int(np.rint(_F32(256.0) * positive))  # lrintf: half to even
    m_neg = int(np.rint(_F32(256.0) * negative))
    d = EVERY_CODE - zp_in
    acc = (zp_out << 8) + 0x80 + d * np.where(d >= 0, m_pos, m_neg)
    return np.clip(acc >> 8, -128, 127).astype(np.int8)  # arithmetic shift: floor


def lut_table(function, s_in, zp_in, s_out, zp_out) -> np.ndarray:
    """XNNPACK's qs8 lookup table for a float function (TANH, LOGISTIC): each code dequantized in
    float32, the function (evaluated in float64 and rounded to float32), times float32(1 / s_out),
    plus zp_out in float32 before rounding half to even (a near-tie such as 1.4999963 - 128 becomes
    -126.5 there and rounds to -126, where rounding first would give -127)."""
    x = (EVERY_CODE - zp_in).astype(np.float32) * _F32(s_in)
    y = function(x.astype(np.float64)).astype(np.float32)
    q = (y * (_F32(1.0) / _F32(s_out))) + _F32(zp_out)
    return np.rint(np.clip(q, _F32(-128), _F32(127))).astype(np.int8)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """XNNPACK's reference sigmoid in float64: e / (1 + e) with e = exp(x), 0 below -100, 1 above 100."""
    e = np.exp(np.clip(x, -100.0, 100.0))
    return np.where(x > 100, 1.0, np.where(x < -100, 0.0, e / (1.0 + e)))


def bilinear_taps(size_in: int, size_out: int, align_corners: bool, half_pixel_centers: bool):
    """One axis of XNNPACK's q11 resize indirection: the lower and upper source index and the 11-bit
    weight of the upper one, per output index."""
    adjust = 1 if align_corners and size_out != 1 else 0
    scale = _F32(_F32(size_in - adjust) / _F32(size_out - adjust))
    pos = np.arange(size_out).astype(np.float32) * scale
    if half_pixel_centers and not align_corners:
        pos = np.clip(pos + _F32(_F32(0.5) * scale - _F32(0.5)), _F32(0.0), _F32(size_in - 1))
    lo = pos.astype(np.int32)  # truncation; pos >= 0
    hi = np.minimum(lo + 1, size_in - 1)
    weight = np.rint((pos - lo.astype(np.float32)) * _F32(2048.0)).astype(np.int64)
    return lo, hi, weight


def resize_bilinear(x: np.ndarray, size: tuple, align_corners: bool, half_pixel_centers: bool) -> np.ndarray:
    """XNNPACK's qs8 RESIZE_BILINEAR of an NHWC int8 batch to size (H, W)."""
    top, bottom, wy = bilinear_taps(x.shape[1], size[0], align_corners, half_pixel_centers)
    left, right, wx = bilinear_taps(x.shape[2], size[1], align_corners, half_pixel_centers)
    v = x.astype(np.int64)
    rows_t, rows_b = v[:, top], v[:, bottom]
    tl, tr, bl, br = rows_t[:, :, left], rows_t[:, :, right], rows_b[:, :, left], rows_b[:, :, right]
    ah, av = wx[None, None, :, None], wy[None, :, None, None]
    upper = (tl << 11) + (tr - tl) * ah
    lower = (bl << 11) + (br - bl) * ah
    acc = (upper << 11) + (lower - upper) * av
    return ((acc + (1 << 21)) >> 22).astype(np.int8)


# SOFTMAX is not delegated in int8: LiteRT's builtin kernel (kernels/activations.cc, generic
# optimized) runs it with a float lookup table, not TFLM's fixed point. x86 builds; a build with
# TFLITE_SOFTMAX_USE_UINT16_LUT (ARM NEON) takes a different table.


def softmax_table(s_in, beta) -> np.ndarray:
    """PopulateSoftmaxLookupTable: table[255 - d] = expf(float32(-s_in * beta) * d) for d in 0..255."""
    scale = _F32(-_F32(s_in) * _F32(beta))
    d = np.arange(256).astype(np.float32)
    return np.exp((scale * d).astype(np.float64)).astype(np.float32)[::-1].copy()


def softmax(rows: np.ndarray, table: np.ndarray, s_out, zp_out) -> np.ndarray:
    """LiteRT's int8 softmax of each row (int8 [R, depth]): e = table[255 - max + x], summed in
    float32 left to right, y = round(e / (sum * s_out)) half away from zero, + zp_out, clamped."""
    x = rows.astype(np.int64)
    e = table[255 - x.max(axis=1, keepdims=True) + x]
    total = np.cumsum(e, axis=1, dtype=np.float32)[:, -1:]  # sequential, as the C++ loop adds
    prob = e * (_F32(1.0) / (total * _F32(s_out)))
    q = np.floor(prob.astype(np.float64) + 0.5)  # std::round of a non-negative float32
    return np.clip(q + zp_out, -128, 127).astype(np.int8)
