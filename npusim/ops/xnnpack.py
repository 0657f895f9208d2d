"""LiteRT's XNNPACK arithmetic for the xnnpack profile (quant.XNNPACK) beyond the MAC ops' fp32
output stage: the forms the int8 kernels take when LiteRT's default interpreter (OpResolverType.AUTO)
hands the op to XNNPACK, each measured against ai-edge-litert 2.3.0 on x86-64 (AVX2). The public
XNNPACK sources are the reference; the arithmetic is re-expressed here, not copied.

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
"""

from __future__ import annotations

import numpy as np

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
