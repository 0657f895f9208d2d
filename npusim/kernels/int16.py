"""The 16x8 paths of the MAC ops: int16 activations (symmetric, zero point 0) with int8 weights, as
TFLM runs them (reference_integer_ops conv.h, depthwise_conv.h and fully_connected.h, the int16
overloads). Plain numpy on int64 accumulators: exactness, not speed, is the aim here; the int8
paths are untouched (the kernels pick this path at Prepare, by the input's type). The checks here
(is_int16, require_int16, require_tflm, range16) serve every 16x8 op; the elementwise ops' 16x8
paths are in ops/int16.py.

TFLM's int16 kernels apply no input or output offset and no filter offset on the per-channel ops:
they assume the symmetric quantization the converter writes, so Prepare refuses a non-zero zero
point. The accumulator has the bias's type: an int64 bias (or none) gives int64 accumulators and
the int64 MultiplyByQuantizedMultiplier (16-bit multiplier, one rounding), an int32 bias int32
accumulators (wrapping) and the int32 one (double rounding).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..graph import Tensor
from ..profiles import profile_of
from ..quant import TFLM, activation_range, multiply_by_quantized_multiplier_int64
from .requant import OutputStage
from .rounding import mbqm_array

INT16_MIN, INT16_MAX = -(2**15), 2**15 - 1
# The int64 MultiplyByQuantizedMultiplier rounds at bit 15 - shift: a shift beyond 14 leaves no
# rounding bit (TFLM asserts shift < 8).
MAX_SHIFT_INT16 = 14


def is_int16(t: Tensor | None) -> bool:
    return t is not None and t.dtype == np.int16


def require_int16(kernel, *tensors: Tensor):
    """int16 activations with a positive scale and zero point 0, as TFLM's 16x8 kernels assume."""
    for t in tensors:
        if t.dtype != np.int16:
            raise kernel.error(
                f"tensor {t.name!r} has type {np.dtype(t.dtype).name}, expected int16 (16x8 op)"
            )
        if t.quant is None or not np.all(t.quant.scale > 0):
            raise kernel.error(f"tensor {t.name!r} has no positive scale, expected int16 with a scale")
        if np.any(t.quant.zero_point != 0):
            raise kernel.error(
                f"tensor {t.name!r} has zero point {int(t.quant.zero_point.ravel()[0])}, "
                "expected 0 (int16 activations are symmetric)"
            )


def require_tflm(kernel):
    if not profile_of(kernel.profile).int16:
        raise kernel.error("int16 activations are supported with the tflm rounding profile only")


def range16(kernel, activation: str, y: Tensor) -> tuple[int, int]:
    """The int16 clamp range of a fused activation (CalculateActivationRangeQuantized)."""
    try:
        return activation_range(activation, float(y.quant.scale[0]), 0, TFLM, INT16_MIN, INT16_MAX)
    except (OverflowError, ValueError):
        raise kernel.error(
            f"output {y.name!r}: scale {float(y.quant.scale[0]):g} is too small for {activation}"
        ) from None


def mbqm(x: np.ndarray, m: int, shift: int) -> np.ndarray:
    """The int32 MultiplyByQuantizedMultiplier (double rounding) over an int64 array of any shape."""
    x = np.ascontiguousarray(x, dtype=np.int64)
    return mbqm_array(x.reshape(-1), int(m), int(shift)).reshape(x.shape)


@dataclasses.dataclass
class Stage16:
    """The output stage of a 16x8 MAC op: per-channel (M, shift), the accumulator's type (that of
    the bias) and the int16 clamp range of the fused activation."""

    multiplier: np.ndarray  # int64 [C]
    shift: np.ndarray  # int64 [C]
    acc_dtype: type  # np.int64 or np.int32
    lo: int
    hi: int

    @classmethod
    def prepare(cls, kernel, x: Tensor, w: Tensor, b: Tensor | None, y: Tensor, channels: int, activation):
        require_tflm(kernel)
        require_int16(kernel, x, y)
        if w.dtype != np.int8 or w.quant is None:
            raise kernel.error(f"filter {w.name!r} has type {np.dtype(w.dtype).name}, expected int8")
        if np.any(w.quant.zero_point != 0):
            raise kernel.error(f"filter {w.name!r} has a non-zero zero point, expected 0 (symmetric)")
        kernel.require_constant(w, "weights")
        if b is not None:
            kernel.require_constant(b, "bias")
            if b.dtype not in (np.int32, np.int64) or b.data.size != channels:
                raise kernel.error(
                    f"bias {b.name!r} is {np.dtype(b.dtype).name} {list(b.shape)}, "
                    f"expected int64 [{channels}]"
                )
        stage = OutputStage.prepare(x, w, y, channels, "NONE")
        if np.any(stage.shift > MAX_SHIFT_INT16):
            raise kernel.error(
                f"requantization multiplier 2^{int(stage.shift.max()) - 1} or more is out of range for int16"
            )
        lo, hi = range16(kernel, activation, y)
        acc = np.int32 if b is not None and b.dtype == np.int32 else np.int64
        return cls(stage.multiplier.astype(np.int64), stage.shift.astype(np.int64), acc, lo, hi)

    def __call__(self, acc: np.ndarray, b: np.ndarray | None) -> np.ndarray:
        """acc: int64 sums of products [..., C] (exact); adds the bias, requantizes, clamps."""
        if self.acc_dtype == np.int32:
            # int32 accumulators wrap as TFLM's do (two's complement), then the int32 overload.
            a = acc.astype(np.int32).astype(np.int64)
            if b is not None:
                a = (a + np.asarray(b, np.int64)).astype(np.int32).astype(np.int64)
            out = np.empty_like(a)
            for c in range(a.shape[-1]):
                out[..., c] = mbqm(a[..., c], self.multiplier[c], self.shift[c])
        else:
            a = acc if b is None else acc + np.asarray(b, np.int64)
            out = multiply_by_quantized_multiplier_int64(a, self.multiplier, self.shift)
        return np.clip(out, self.lo, self.hi).astype(np.int16)


def padded(x: np.ndarray, pad_top: int, pad_left: int, out_h, out_w, kh, kw, stride, dilation):
    """x [N, H, W, C] zero-padded so that every tap of every output pixel is in bounds (a padding
    tap then reads 0, which TFLM's skipped tap equals with zero point 0)."""
    n, h, w, c = x.shape
    need_h = (out_h - 1) * stride[0] + (kh - 1) * dilation[0] + 1
    need_w = (out_w - 1) * stride[1] + (kw - 1) * dilation[1] + 1
    bottom = max(need_h - pad_top - h, 0)
    right = max(need_w - pad_left - w, 0)
    return np.pad(x.astype(np.int64), ((0, 0), (pad_top, bottom), (pad_left, right), (0, 0)))


def taps(xp: np.ndarray, i: int, j: int, out_h, out_w, stride, dilation) -> np.ndarray:
    """The input pixels that tap (i, j) of every output pixel reads: [N, out_h, out_w, C]."""
    r0, c0 = i * dilation[0], j * dilation[1]
    return xp[
        :,
        r0 : r0 + (out_h - 1) * stride[0] + 1 : stride[0],
        c0 : c0 + (out_w - 1) * stride[1] + 1 : stride[1],
        :,
    ]


def conv16(x, w, geometry) -> np.ndarray:
    """CONV_2D sums: x int16 [N, H, W, C], w int8 [O, kh, kw, C] -> int64 [N, oh, ow, O]."""
    g = geometry
    xp = padded(x, *g.pad, g.out_h, g.out_w, g.kh, g.kw, g.stride, g.dilation)
    acc = np.zeros((x.shape[0], g.out_h, g.out_w, w.shape[0]), np.int64)
    w64 = w.astype(np.int64)
    for i in range(g.kh):
        for j in range(g.kw):
            acc += taps(xp, i, j, g.out_h, g.out_w, g.stride, g.dilation) @ w64[:, i, j, :].T
    return acc


def depthwise16(x, w, geometry, multiplier: int) -> np.ndarray:
    """DEPTHWISE_CONV_2D sums: w int8 [1, kh, kw, C * m], output channel c * m + k reads channel c."""
    g = geometry
    xp = padded(x, *g.pad, g.out_h, g.out_w, g.kh, g.kw, g.stride, g.dilation)
    xp = np.repeat(xp, multiplier, axis=3)
    acc = np.zeros((x.shape[0], g.out_h, g.out_w, w.shape[3]), np.int64)
    w64 = w.astype(np.int64)
    for i in range(g.kh):
        for j in range(g.kw):
            acc += taps(xp, i, j, g.out_h, g.out_w, g.stride, g.dilation) * w64[0, i, j, :]
    return acc
